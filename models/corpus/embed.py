"""Turns corpus.txt into a C++ source defining mt::detail::kCorpusBytes / kCorpusSize."""
import sys

data = open(sys.argv[1], 'rb').read()
with open(sys.argv[2], 'w') as out:
    out.write('// Generated from models/corpus/corpus.txt by embed.py. Do not edit.\n')
    out.write('#include <cstddef>\n#include <cstdint>\n')
    out.write('namespace mt::detail {\n')
    out.write('extern const uint8_t kCorpusBytes[] = {\n')
    for i in range(0, len(data), 24):
        out.write(','.join(str(b) for b in data[i:i + 24]) + ',\n')
    out.write('0};\n')
    out.write(f'extern const size_t kCorpusSize = {len(data)};\n')
    out.write('}  // namespace mt::detail\n')
