// Boost.Process v2 as mcprun builds it: compiled once (boost_process.cpp) and on std::filesystem
// (BOOST_PROCESS_V2_SEPARATE_COMPILATION and BOOST_PROCESS_USE_STD_FS, set by CMake for every
// user), so nothing links boost_filesystem. Include v2 through this header only.
#pragma once

// 1.81's v2 names boost::optional, boost::is_constructible and boost::remove_pointer unqualified
// and gets them only from Boost.Filesystem's headers, which std::filesystem leaves out.
#include <boost/asio/io_context.hpp>
#include <boost/optional.hpp>
#include <boost/process/v2/posix/default_launcher.hpp>
#include <boost/process/v2/process.hpp>
#include <boost/process/v2/stdio.hpp>
#include <boost/type_traits/is_constructible.hpp>
#include <boost/type_traits/remove_pointer.hpp>

namespace mcprun {

/// A child process awaited through Boost.Process v2: on Linux its pidfd, on an Asio loop.
using ChildProcess = boost::process::v2::basic_process<boost::asio::io_context::executor_type>;

}  // namespace mcprun
