// PLACEHOLDER: tests for random.
#include "testing.h"
