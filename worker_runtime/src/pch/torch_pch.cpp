// Compiled only to produce the precompiled LibTorch header the runtime, tests and examples reuse.
