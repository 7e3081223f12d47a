// PLACEHOLDER: tests for norm.
#include "testing.h"
