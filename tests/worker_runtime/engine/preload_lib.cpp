// A tiny shared library for library_preload_test.cpp (built twice, under two names).
extern "C" int gpurun_preload_test_symbol() {
  return GPURUN_PRELOAD_VALUE;
}
