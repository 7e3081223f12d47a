// PLACEHOLDER: tests for data.
#include "testing.h"
