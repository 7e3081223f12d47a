// PLACEHOLDER: tests for index.
#include "testing.h"
