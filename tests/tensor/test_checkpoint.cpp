// PLACEHOLDER: tests for checkpoint.
#include "testing.h"
