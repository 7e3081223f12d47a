// PLACEHOLDER: tests for config.
#include "testing.h"
