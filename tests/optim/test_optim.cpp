// PLACEHOLDER: tests for optim.
#include "testing.h"
