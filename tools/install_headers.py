#!/usr/bin/env python3
# Meson install script: in the installed headers (include/meshtrain/...), rewrites meshtrain's own
# includes from the in-tree form "tensor/ops.h" to <meshtrain/tensor/ops.h>, so that a consumer
# needs only -I<prefix>/include and no header of its own (say its models/config.h) can shadow
# ours. The source tree keeps the short form; only the installed copies change.
# usage (from meson.add_install_script): install_headers.py INCLUDEDIR_RELATIVE_TO_PREFIX
import os
import re
import sys

OWN = r'(?:runtime|kernels|tensor|mesh|optim|plan|models|checkpoint)/[^"]+|config\.h'
PATTERN = re.compile(r'^(\s*#\s*include\s+)"(' + OWN + r')"', re.M)

root = os.path.join(os.environ['MESON_INSTALL_DESTDIR_PREFIX'], sys.argv[1], 'meshtrain')
count = 0
for dirpath, _, names in os.walk(root):
    for name in names:
        if not name.endswith(('.h', '.cuh')):
            continue
        path = os.path.join(dirpath, name)
        with open(path, encoding='utf-8') as f:
            text = f.read()
        new, n = PATTERN.subn(r'\1<meshtrain/\2>', text)
        if n:
            with open(path, 'w', encoding='utf-8') as f:
                f.write(new)
            count += n
if not os.environ.get('MESON_INSTALL_QUIET'):
    print(f'install_headers.py: {count} includes rewritten to <meshtrain/...> under {root}')
