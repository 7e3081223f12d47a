// Preloaded into every test process of the sanitizer build (LD_PRELOAD, tests/meson.build): a
// dlclose that keeps the library mapped. Open MPI dlopens its MCA plugins and dlcloses them in
// MPI_Finalize, before LeakSanitizer's exit-time check runs; the plugins' allocation stacks then
// point into unmapped memory, and the suppressions by library name (lsan.supp) cannot match
// them. With the plugins kept, the top frames name their libraries, so ASan's fast frame-pointer
// unwinder at malloc is enough: the full unwinder it replaces made the suite about three times
// slower (docs/decisions.md, "CI time"). meshtrain itself never dlopens anything.
// Built without sanitizers: uninstrumented processes (bash, mpirun) load it too.
extern "C" int dlclose(void*) { return 0; }
