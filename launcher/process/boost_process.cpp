// Boost.Process v2's compiled part, in this one translation unit (see boost_process.hpp).
#include "launcher/process/boost_process.hpp"

#include <boost/process/v2/src.hpp>
