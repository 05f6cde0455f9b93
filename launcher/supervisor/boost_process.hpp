// Compatibility seam for Boost.Process v2 across Boost 1.81 (Debian 12) and
// 1.83 (Ubuntu 24.04). With BOOST_PROCESS_USE_STD_FS, 1.81's part headers use
// boost::optional, boost::io::quoted and <type_traits> names without including
// them, and its environment.hpp does not compile at all; so include exactly
// what gpurun uses, after the missing pieces.
#pragma once

#include <type_traits>

#include <boost/io/quoted.hpp>
#include <boost/optional.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
