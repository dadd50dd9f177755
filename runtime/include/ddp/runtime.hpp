#pragma once
// libddp: the umbrella header for worker programs.
