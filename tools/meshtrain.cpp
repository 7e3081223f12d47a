// meshtrain CLI (placeholder until the smoke command lands).
#include "tensor/ops.h"
int main() { return 0; }
