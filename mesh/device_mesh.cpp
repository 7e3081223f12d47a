// DeviceMesh: coordinates from the world rank, sub-meshes as lists of root dims, and the shared
// communicator cache (one per set of root dims).
#include "mesh/device_mesh.h"

#include <algorithm>
#include <map>
#include <mutex>

#include "mesh/world.h"
#include "runtime/error.h"

namespace mt {

namespace {

std::string quoted(const std::vector<std::string>& names) {
  std::string s = "[";
  for (size_t i = 0; i < names.size(); ++i) {
    if (i) s += ", ";
    s += fmt::format("\"{}\"", names[i]);
  }
  return s + "]";
}

std::string join_ranks(const std::vector<int>& ranks) {
  std::string s = "[";
  for (size_t i = 0; i < ranks.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", ranks[i]);
  return s + "]";
}

}  // namespace

struct DeviceMesh::Root {
  Shape shape;
  std::vector<std::string> names;
  std::vector<int64_t> coords;  // this rank's coordinates in the root mesh
  bool simulated = false;       // DeviceMesh::simulated: no communicators
  std::mutex mutex;
  std::map<uint32_t, Communicator> comms;  // key: bit mask of root dims
  std::map<std::vector<std::vector<int>>, std::string> rank_keys;  // world_ranks_key() by dims

  std::string str() const { return fmt::format("DeviceMesh({}, {})", shape, quoted(names)); }
};

namespace {

void check_dims(const Shape& shape, const std::vector<std::string>& names, const std::string& what) {
  MT_CHECK(shape.size() >= 1, "{}: a mesh needs at least one dim", what);
  MT_CHECK(static_cast<int>(names.size()) == shape.size(), "{}: shape has {} dims but {} names given",
           what, shape.size(), names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    MT_CHECK(!names[i].empty(), "{}: dim {} has an empty name", what, i);
    MT_CHECK(std::count(names.begin(), names.end(), names[i]) == 1, "{}: dim name \"{}\" is repeated",
             what, names[i]);
    MT_CHECK(shape[static_cast<int>(i)] >= 1, "{}: dim \"{}\" has size {}; sizes must be >= 1", what,
             names[i], shape[static_cast<int>(i)]);
  }
}

}  // namespace

DeviceMesh::DeviceMesh(Shape shape, std::vector<std::string> names) {
  const std::string what = fmt::format("DeviceMesh({}, {})", shape, quoted(names));
  check_dims(shape, names, what);
  const World& w = world();
  MT_CHECK(shape.numel() == w.size(),
           "{}: the mesh has {} ranks but the world has {} (start the job with mpirun -np {})",
           what, shape.numel(), w.size(), shape.numel());
  auto root = std::make_shared<Root>();
  root->shape = shape;
  root->names = names;
  root->coords.assign(static_cast<size_t>(shape.size()), 0);
  int64_t r = w.rank();
  for (int d = shape.size() - 1; d >= 0; --d) {
    root->coords[static_cast<size_t>(d)] = r % shape[d];
    r /= shape[d];
  }
  root_ = std::move(root);
  for (int d = 0; d < shape.size(); ++d) dims_.push_back({d});
  names_ = std::move(names);
}

DeviceMesh DeviceMesh::simulated(Shape shape, std::vector<std::string> names, std::vector<int64_t> coords) {
  const std::string what = fmt::format("DeviceMesh::simulated({}, {})", shape, quoted(names));
  check_dims(shape, names, what);
  MT_CHECK(static_cast<int>(coords.size()) == shape.size(), "{}: {} coordinates for {} dims", what, coords.size(),
           shape.size());
  for (int d = 0; d < shape.size(); ++d)
    MT_CHECK(coords[static_cast<size_t>(d)] >= 0 && coords[static_cast<size_t>(d)] < shape[d],
             "{}: coordinate {} of dim \"{}\" is outside 0..{}", what, coords[static_cast<size_t>(d)],
             names[static_cast<size_t>(d)], shape[d] - 1);
  auto root = std::make_shared<Root>();
  root->shape = shape;
  root->names = names;
  root->coords = std::move(coords);
  root->simulated = true;
  std::vector<std::vector<int>> dims;
  for (int d = 0; d < shape.size(); ++d) dims.push_back({d});
  return DeviceMesh(std::move(root), std::move(dims), std::move(names));
}

bool DeviceMesh::is_simulated() const { return root_->simulated; }

DeviceMesh::DeviceMesh(std::shared_ptr<Root> root, std::vector<std::vector<int>> dims,
                       std::vector<std::string> names)
    : root_(std::move(root)), dims_(std::move(dims)), names_(std::move(names)) {}

Shape DeviceMesh::shape() const {
  Shape s;
  for (int d = 0; d < ndim(); ++d) s.push_back(size(d));
  return s;
}

int64_t DeviceMesh::size() const { return shape().numel(); }

int64_t DeviceMesh::size(int dim) const {
  MT_CHECK(dim >= 0 && dim < ndim(), "{}: dim {} out of range for {} dims", str(), dim, ndim());
  int64_t n = 1;
  for (int rd : dims_[static_cast<size_t>(dim)]) n *= root_->shape[rd];
  return n;
}

int64_t DeviceMesh::size(const std::string& name) const { return size(dim_index(name)); }

int DeviceMesh::dim_index(const std::string& name) const {
  auto it = std::find(names_.begin(), names_.end(), name);
  MT_CHECK(it != names_.end(), "{}: no dim named \"{}\" (dims are {})", str(), name, quoted(names_));
  return static_cast<int>(it - names_.begin());
}

int64_t DeviceMesh::coordinate(int dim) const {
  MT_CHECK(dim >= 0 && dim < ndim(), "{}: dim {} out of range for {} dims", str(), dim, ndim());
  int64_t c = 0;
  for (int rd : dims_[static_cast<size_t>(dim)]) c = c * root_->shape[rd] + root_->coords[static_cast<size_t>(rd)];
  return c;
}

int64_t DeviceMesh::coordinate(const std::string& name) const { return coordinate(dim_index(name)); }

std::vector<int64_t> DeviceMesh::coordinates() const {
  std::vector<int64_t> c;
  for (int d = 0; d < ndim(); ++d) c.push_back(coordinate(d));
  return c;
}

Shape DeviceMesh::coordinate_shape() const {
  Shape c;
  for (int d = 0; d < ndim(); ++d) c.push_back(coordinate(d));
  return c;
}

int64_t DeviceMesh::rank() const {
  int64_t r = 0;
  for (int d = 0; d < ndim(); ++d) r = r * size(d) + coordinate(d);
  return r;
}

namespace {

// Members of the group spanned by `root_dims` (increasing) around `coords`, row-major among them.
std::vector<int> group_ranks(const Shape& shape, const std::vector<int64_t>& coords,
                             const std::vector<int>& root_dims) {
  int64_t n = 1;
  for (int rd : root_dims) n *= shape[rd];
  std::vector<int> ranks;
  ranks.reserve(static_cast<size_t>(n));
  std::vector<int64_t> c = coords;
  for (int64_t i = 0; i < n; ++i) {
    int64_t rem = i;
    for (size_t k = root_dims.size(); k-- > 0;) {
      const int rd = root_dims[k];
      c[static_cast<size_t>(rd)] = rem % shape[rd];
      rem /= shape[rd];
    }
    int64_t w = 0;
    for (int d = 0; d < shape.size(); ++d) w = w * shape[d] + c[static_cast<size_t>(d)];
    ranks.push_back(static_cast<int>(w));
  }
  return ranks;
}

}  // namespace

std::vector<int> DeviceMesh::world_ranks() const {
  std::vector<int> all;
  for (const auto& d : dims_) all.insert(all.end(), d.begin(), d.end());
  return group_ranks(root_->shape, root_->coords, all);
}

std::vector<int> DeviceMesh::root_dims_of(const std::vector<std::string>& names, const char* op) const {
  MT_CHECK(!names.empty(), "{}.{}: no dims named", str(), op);
  std::vector<int> idx;
  for (const auto& n : names) {
    const int i = dim_index(n);
    MT_CHECK(idx.empty() || i > idx.back(),
             "{}.{}({}): dims must be distinct and in mesh order ({})", str(), op, quoted(names),
             quoted(names_));
    idx.push_back(i);
  }
  return idx;
}

DeviceMesh DeviceMesh::operator[](const std::string& name) const {
  const int d = dim_index(name);
  return DeviceMesh(root_, {dims_[static_cast<size_t>(d)]}, {name});
}

DeviceMesh DeviceMesh::select(const std::vector<std::string>& names) const {
  std::vector<std::vector<int>> dims;
  for (int i : root_dims_of(names, "select")) dims.push_back(dims_[static_cast<size_t>(i)]);
  return DeviceMesh(root_, std::move(dims), names);
}

DeviceMesh DeviceMesh::flatten(const std::vector<std::string>& names) const {
  std::vector<int> fused;
  std::string name;
  for (int i : root_dims_of(names, "flatten")) {
    const auto& d = dims_[static_cast<size_t>(i)];
    fused.insert(fused.end(), d.begin(), d.end());
    name += (name.empty() ? "" : "_") + names_[static_cast<size_t>(i)];
  }
  return DeviceMesh(root_, {fused}, {name});
}

const std::string& DeviceMesh::world_ranks_key() const {
  std::lock_guard<std::mutex> lock(root_->mutex);
  auto it = root_->rank_keys.find(dims_);
  if (it != root_->rank_keys.end()) return it->second;
  // A short, process-wide id per distinct rank list: equal groups of different DeviceMesh objects
  // get equal keys, and a key costs nothing to hash or compare however large the group.
  static std::mutex ids_mutex;
  static auto* ids = new std::map<std::vector<int>, int64_t>();
  std::lock_guard<std::mutex> ids_lock(ids_mutex);
  auto [id, fresh] = ids->emplace(world_ranks(), static_cast<int64_t>(ids->size()));
  (void)fresh;
  return root_->rank_keys.emplace(dims_, fmt::format("g{}[{}]", id->second, id->first.size())).first->second;
}

std::string DeviceMesh::label_of(std::vector<int> root_dims) const {
  std::sort(root_dims.begin(), root_dims.end());
  std::string s;
  for (int rd : root_dims) s += (s.empty() ? "" : ",") + root_->names[static_cast<size_t>(rd)];
  return s;
}

std::string DeviceMesh::dim_label(int dim) const {
  MT_CHECK(dim >= 0 && dim < ndim(), "{}: dim {} out of range for {} dims", str(), dim, ndim());
  return label_of(dims_[static_cast<size_t>(dim)]);
}

Communicator DeviceMesh::comm_for(const std::vector<int>& root_dims) const {
  uint32_t mask = 0;
  std::vector<std::string> dim_names;
  for (int rd : root_dims) {
    mask |= 1u << rd;
    dim_names.push_back(root_->names[static_cast<size_t>(rd)]);
  }
  MT_CHECK(!root_->simulated, "{}: a simulated mesh (a plan checked on meta tensors) has no communicator for "
           "mesh dims {}", root_->str(), quoted(dim_names));
  std::lock_guard<std::mutex> lock(root_->mutex);
  auto it = root_->comms.find(mask);
  if (it != root_->comms.end()) return it->second;
  const std::vector<int> ranks = group_ranks(root_->shape, root_->coords, root_dims);
  Communicator c = Communicator::create(
      ranks, static_cast<int>(mask),
      fmt::format("mesh dims {} of {} (world ranks {})", quoted(dim_names), root_->str(),
                  join_ranks(ranks)),
      label_of(root_dims));
  root_->comms.emplace(mask, c);
  return c;
}

Communicator DeviceMesh::comm() const {
  std::vector<int> all;
  for (const auto& d : dims_) all.insert(all.end(), d.begin(), d.end());
  return comm_for(all);
}

Communicator DeviceMesh::comm(int dim) const {
  MT_CHECK(dim >= 0 && dim < ndim(), "{}: dim {} out of range for {} dims", str(), dim, ndim());
  return comm_for(dims_[static_cast<size_t>(dim)]);
}

Communicator DeviceMesh::comm(const std::string& name) const { return comm(dim_index(name)); }

std::string DeviceMesh::str() const {
  return fmt::format("DeviceMesh({}, {})", shape(), quoted(names_));
}

}  // namespace mt
