// PLACEHOLDER: tests for rope.
#include "testing.h"
