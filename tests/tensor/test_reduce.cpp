// PLACEHOLDER: tests for reduce.
#include "testing.h"
