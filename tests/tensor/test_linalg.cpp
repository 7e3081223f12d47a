// PLACEHOLDER: tests for linalg.
#include "testing.h"
