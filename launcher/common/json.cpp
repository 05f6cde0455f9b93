// Boost.JSON in header-only mode: the one translation unit of the whole program that
// compiles its implementation (library gpurun_json). Every other source includes
// <boost/json.hpp> and links gpurun_json; including <boost/json/src.hpp> anywhere else
// would define its symbols twice.
#include <boost/json/src.hpp>
