# Source on a GPU host without package access, from the repository root:  source tools/gpu_env.sh
# Unpacks .gpu-deps/*.deb (tools/gpu_deps.sh) into $MT_GPU_PREFIX (default /opt/meshtrain-deps) once,
# never into /, and exports what meson, the compilers, mpirun and the loader need: PATH, CPATH,
# LIBRARY_PATH, LD_LIBRARY_PATH, PKG_CONFIG_PATH, OPAL_PREFIX, and Open MPI's run-as-root switches.
# NCCL comes from the CUDA toolkit when it has one, else from the nvidia-nccl Python wheel, whose
# headers and library are exposed through a small prefix (the wheel has no libnccl.so link).
_mt_src="$(pwd)/.gpu-deps"
_mt_pre="${MT_GPU_PREFIX:-/opt/meshtrain-deps}"
if [ -d "$_mt_src" ] && [ ! -f "$_mt_pre/.unpacked" ]; then
  mkdir -p "$_mt_pre"
  for _f in "$_mt_src"/*.deb; do dpkg -x "$_f" "$_mt_pre"; done
  find "$_mt_pre/usr" -name '*.pc' -type f -exec sed -i "s|=/usr|=$_mt_pre/usr|g" {} +
  for _b in orterun:mpirun orterun:mpiexec mpic++.openmpi:mpicxx mpicc.openmpi:mpicc; do
    ln -sf "$_mt_pre/usr/bin/${_b%%:*}" "$_mt_pre/usr/bin/${_b##*:}"
  done
  touch "$_mt_pre/.unpacked"
fi
_mt_lib="$_mt_pre/usr/lib/x86_64-linux-gnu"
export OPAL_PREFIX="$_mt_pre/usr"
export PATH="$_mt_pre/usr/bin:/usr/local/cuda/bin:$PATH"
export CPATH="$_mt_pre/usr/include:$_mt_lib/openmpi/include${CPATH:+:$CPATH}"
export PKG_CONFIG_PATH="$_mt_lib/pkgconfig:$_mt_lib/openmpi/lib/pkgconfig:$_mt_pre/usr/share/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export LD_LIBRARY_PATH="$_mt_lib:$_mt_lib/openmpi/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ ! -e /usr/local/cuda/include/nccl.h ]; then
  _mt_nccl=$(python3 -c 'import nvidia.nccl, os; print(os.path.dirname(nvidia.nccl.__file__) if nvidia.nccl.__file__ else list(nvidia.nccl.__path__)[0])' 2>/dev/null)
  if [ -n "$_mt_nccl" ] && [ -e "$_mt_nccl/include/nccl.h" ]; then
    mkdir -p "$_mt_pre/nccl/lib"
    ln -sf "$_mt_nccl/include" "$_mt_pre/nccl/include"
    ln -sf "$(ls "$_mt_nccl"/lib/libnccl.so* | head -n 1)" "$_mt_pre/nccl/lib/libnccl.so"
    export CPATH="$_mt_pre/nccl/include:$CPATH"
    export LIBRARY_PATH="$_mt_pre/nccl/lib${LIBRARY_PATH:+:$LIBRARY_PATH}"
    export LD_LIBRARY_PATH="$_mt_nccl/lib:$LD_LIBRARY_PATH"
  fi
fi
# PMIx looks for its plugins where Debian installs them; a host with another PMIx there would load
# mismatched ones (harmless, but noisy): point it at the unpacked ones.
export PMIX_MCA_mca_base_component_path="$_mt_lib/pmix2/lib/pmix" PMIX_MCA_pcompress_base_silence_warning=1
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none  # no cross-memory attach inside sandboxes
unset _mt_src _mt_pre _mt_lib _mt_nccl _f _b
