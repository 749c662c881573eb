// Python's text forms that Megatron's output and cache names depend on.
#pragma once

#include <string>

namespace tessera {

// Python's repr() of a float: the shortest digits that round-trip, fixed notation for
// decimal exponents in [-4, 16) (with ".0" for integral values), else d.ddde[+-]XX;
// "nan", "inf", "-inf".
std::string python_float_repr(double x);

}  // namespace tessera
