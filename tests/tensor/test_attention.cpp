// PLACEHOLDER: tests for attention.
#include "testing.h"
