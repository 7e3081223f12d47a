// PLACEHOLDER: tests for loss.
#include "testing.h"
