#include "ddp/launcher/launch_config.hpp"
