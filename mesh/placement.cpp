// Placement construction, printing and parsing. The printed form is the parse form, so plan files,
// logs and error messages all speak the same short language: R, S(0), P(sum), IS(0,3),
// RS(0,[2,1,3],b4).
#include "mesh/placement.h"

#include <charconv>
#include <limits>

#include "runtime/error.h"
#include "runtime/shape.h"

namespace mt {

const char* partial_op_name(PartialOp op) {
  switch (op) {
    case PartialOp::kSum: return "sum";
    case PartialOp::kAvg: return "avg";
    case PartialOp::kMax: return "max";
    case PartialOp::kMin: return "min";
  }
  return "?";
}

Placement Placement::replicate() { return Placement(); }

Placement Placement::shard(int dim) {
  MT_CHECK(dim >= 0, "Shard: dim must be >= 0, got {}", dim);
  Placement p;
  p.kind_ = PlacementKind::kShard;
  p.dim_ = dim;
  return p;
}

Placement Placement::partial(PartialOp op) {
  Placement p;
  p.kind_ = PlacementKind::kPartial;
  p.op_ = op;
  return p;
}

Placement Placement::interleaved_shard(int dim, int64_t groups) {
  MT_CHECK(dim >= 0, "InterleavedShard: dim must be >= 0, got {}", dim);
  MT_CHECK(groups >= 1, "InterleavedShard: groups must be >= 1, got {} (dim {})", groups, dim);
  Placement p;
  p.kind_ = PlacementKind::kInterleavedShard;
  p.dim_ = dim;
  p.groups_ = groups;
  return p;
}

Placement Placement::zigzag_shard(int dim) {
  MT_CHECK(dim >= 0, "ZigzagShard: dim must be >= 0, got {}", dim);
  Placement p = interleaved_shard(dim, 2);
  p.mirrored_ = true;
  return p;
}

Placement Placement::ragged_shard(int dim, std::vector<int64_t> units, int64_t block) {
  MT_CHECK(dim >= 0, "RaggedShard: dim must be >= 0, got {}", dim);
  MT_CHECK(block >= 1, "RaggedShard: block must be >= 1, got {} (dim {})", block, dim);
  MT_CHECK(!units.empty(), "RaggedShard: empty units per rank (dim {})", dim);
  // Every row count formed later (a rank's offset and length, the sum against the dim's size) is
  // at most total * block, which must therefore fit in 64 bits.
  int64_t total = 0, rows = 0;
  for (int64_t u : units) {
    MT_CHECK(u >= 0, "RaggedShard: negative unit count {} in units per rank [{}]", u,
             fmt::join(units, ","));
    MT_CHECK(checked_add(total, u, &total) && checked_mul(total, block, &rows),
             "RaggedShard: units per rank [{}] of {} rows each overflow a 64-bit row count (dim {})",
             fmt::join(units, ","), block, dim);
  }
  Placement p;
  p.kind_ = PlacementKind::kRaggedShard;
  p.dim_ = dim;
  p.block_ = block;
  p.units_ = std::move(units);
  return p;
}

std::string Placement::str() const {
  switch (kind_) {
    case PlacementKind::kReplicate: return "R";
    case PlacementKind::kShard: return fmt::format("S({})", dim_);
    case PlacementKind::kPartial: return fmt::format("P({})", partial_op_name(op_));
    case PlacementKind::kInterleavedShard:
      return mirrored_ ? fmt::format("ZS({})", dim_) : fmt::format("IS({},{})", dim_, groups_);
    case PlacementKind::kRaggedShard:
      return fmt::format("RS({},[{}],b{})", dim_, fmt::join(units_, ","), block_);
  }
  return "?";
}

size_t Placement::hash() const {
  // FNV-1a style mixing of every field; placements are tiny, so this is a handful of multiplies.
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) {
    h ^= v + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2);
    h *= 1099511628211ull;
  };
  mix(static_cast<uint64_t>(kind_));
  mix(static_cast<uint64_t>(op_));
  mix(static_cast<uint64_t>(static_cast<int64_t>(dim_)));
  mix(static_cast<uint64_t>(groups_));
  mix(static_cast<uint64_t>(mirrored_));
  mix(static_cast<uint64_t>(block_));
  for (int64_t u : units_) mix(static_cast<uint64_t>(u));
  return static_cast<size_t>(h);
}

namespace {

// A cursor over the placement text (spaces removed) that reports errors naming the whole text.
class Parser {
 public:
  Parser(std::string_view original, std::string text) : original_(original), s_(std::move(text)) {}

  bool done() const { return i_ >= s_.size(); }
  bool eat(std::string_view tok) {
    if (s_.compare(i_, tok.size(), tok) != 0) return false;
    i_ += tok.size();
    return true;
  }
  void expect(std::string_view tok) {
    if (!eat(tok)) fail(fmt::format("expected '{}'", tok));
  }
  int64_t integer() {
    int64_t v = 0;
    const char* b = s_.data() + i_;
    const char* e = s_.data() + s_.size();
    auto [ptr, ec] = std::from_chars(b, e, v);
    if (ec != std::errc() || ptr == b) fail("expected an integer");
    i_ += static_cast<size_t>(ptr - b);
    return v;
  }
  int dim() {
    const int64_t v = integer();
    if (v < 0 || v > std::numeric_limits<int>::max()) fail(fmt::format("bad tensor dim {}", v));
    return static_cast<int>(v);
  }
  [[noreturn]] void fail(const std::string& what) const {
    MT_FAIL("Placement::parse: cannot parse '{}': {} at position {} (forms: R, S(d), P(sum|avg|max|min), "
            "IS(d,groups), ZS(d), RS(d,[u0,u1,...],bBLOCK))",
            original_, what, i_);
  }

  Placement placement() {
    if (eat("RS(")) {
      const int d = dim();
      expect(",");
      expect("[");
      std::vector<int64_t> units;
      if (!eat("]")) {
        do units.push_back(integer());
        while (eat(","));
        expect("]");
      }
      int64_t block = 1;
      if (eat(",")) {
        expect("b");
        block = integer();
      }
      expect(")");
      return checked([&] { return Placement::ragged_shard(d, units, block); });
    }
    if (eat("IS(")) {
      const int d = dim();
      expect(",");
      const int64_t g = integer();
      expect(")");
      return checked([&] { return Placement::interleaved_shard(d, g); });
    }
    if (eat("ZS(")) {
      const int d = dim();
      expect(")");
      return Placement::zigzag_shard(d);
    }
    if (eat("S(")) {
      const int d = dim();
      expect(")");
      return Placement::shard(d);
    }
    if (eat("P")) {
      if (!eat("(")) return Placement::partial(PartialOp::kSum);
      for (PartialOp op : {PartialOp::kSum, PartialOp::kAvg, PartialOp::kMax, PartialOp::kMin}) {
        if (eat(partial_op_name(op))) {
          expect(")");
          return Placement::partial(op);
        }
      }
      fail("expected a reduce op sum, avg, max or min");
    }
    if (eat("R")) return Placement::replicate();
    fail("unknown placement");
  }

 private:
  // Re-throws a construction error with the text in it.
  template <class F>
  Placement checked(F&& make) {
    try {
      return make();
    } catch (const Error& e) {
      MT_FAIL("Placement::parse: invalid placement '{}': {}", original_, e.what());
    }
  }

  std::string_view original_;
  std::string s_;
  size_t i_ = 0;
};

std::string strip_spaces(std::string_view text) {
  std::string s;
  for (char c : text)
    if (c != ' ' && c != '\t' && c != '\n') s.push_back(c);
  return s;
}

}  // namespace

Placement Placement::parse(std::string_view text) {
  Parser p(text, strip_spaces(text));
  if (p.done()) p.fail("empty text");
  Placement out = p.placement();
  if (!p.done()) p.fail("trailing characters");
  return out;
}

std::string placements_str(const Placements& ps) {
  std::string s = "[";
  for (size_t i = 0; i < ps.size(); ++i) {
    if (i) s += ", ";
    s += ps[i].str();
  }
  return s + "]";
}

Placements parse_placements(std::string_view text) {
  std::string s = strip_spaces(text);
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = s.substr(1, s.size() - 2);
  Placements out;
  if (s.empty()) return out;
  // Split at commas outside parentheses and brackets.
  int depth = 0;
  size_t start = 0;
  for (size_t i = 0; i <= s.size(); ++i) {
    const char c = i < s.size() ? s[i] : ',';
    if (c == '(' || c == '[') ++depth;
    if (c == ')' || c == ']') --depth;
    MT_CHECK(depth >= 0, "parse_placements: unbalanced brackets in '{}'", text);
    if (c == ',' && depth == 0) {
      MT_CHECK(i > start, "parse_placements: empty placement in '{}'", text);
      try {
        out.push_back(Placement::parse(std::string_view(s).substr(start, i - start)));
      } catch (const Error& e) {
        MT_FAIL("parse_placements: in '{}': {}", text, e.what());
      }
      start = i + 1;
    }
  }
  MT_CHECK(depth == 0, "parse_placements: unbalanced brackets in '{}'", text);
  return out;
}

}  // namespace mt
