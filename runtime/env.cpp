#include "ddp/runtime.hpp"
