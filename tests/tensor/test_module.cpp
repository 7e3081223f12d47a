// PLACEHOLDER: tests for module.
#include "testing.h"
