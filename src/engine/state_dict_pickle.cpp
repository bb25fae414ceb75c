// Reading the pickle torch.save writes for a state dict, strictly (see state_dict_pickle.h).
#include "state_dict_pickle.h"

#include <fmt/format.h>

#include <cstring>
#include <map>
#include <memory>
#include <optional>

#include "pipetrain/error.h"

namespace pipetrain::detail {
namespace {

// Containers nested deeper than this are no state dict (and freeing them would recurse as deep).
constexpr int kMaxDepth = 64;
constexpr size_t kMaxNameLength = 256;  // of a GLOBAL's module or name, and of a storage key
constexpr size_t kMaxTensorDims = 64;

struct Value;
using Ref = std::shared_ptr<Value>;

struct Value {
  enum class Kind { None, Bool, Int, Float, String, Tuple, List, Dict, Global, Storage, Tensor };
  Kind kind = Kind::None;
  int64_t i = 0;           // Int and Bool
  double f = 0;            // Float
  std::string s;           // String; Global: "module.name"
  std::vector<Ref> items;  // Tuple, List; Dict: key, value, key, value...
  torch::Tensor tensor;    // Storage: its elements, flat; Tensor
  int depth = 1;
  // Set once the container is inside another: it may not change after that, so no container can
  // come to hold itself (a cycle would never be freed).
  bool inside = false;
};

const char* name_of(Value::Kind kind) {
  switch (kind) {
    case Value::Kind::None: return "None";
    case Value::Kind::Bool: return "a bool";
    case Value::Kind::Int: return "an int";
    case Value::Kind::Float: return "a float";
    case Value::Kind::String: return "a string";
    case Value::Kind::Tuple: return "a tuple";
    case Value::Kind::List: return "a list";
    case Value::Kind::Dict: return "a dict";
    case Value::Kind::Global: return "a global";
    case Value::Kind::Storage: return "a storage";
    case Value::Kind::Tensor: return "a tensor";
  }
  return "a value";
}

std::optional<c10::ScalarType> storage_dtype(const std::string& global) {
  static const std::map<std::string, c10::ScalarType> types = {
      {"torch.FloatStorage", c10::kFloat},   {"torch.DoubleStorage", c10::kDouble},
      {"torch.HalfStorage", c10::kHalf},     {"torch.BFloat16Storage", c10::kBFloat16},
      {"torch.LongStorage", c10::kLong},     {"torch.IntStorage", c10::kInt},
      {"torch.ShortStorage", c10::kShort},   {"torch.CharStorage", c10::kChar},
      {"torch.ByteStorage", c10::kByte},     {"torch.BoolStorage", c10::kBool}};
  const auto it = types.find(global);
  if (it == types.end()) return std::nullopt;
  return it->second;
}

class Reader {
 public:
  Reader(const std::string& pickle, const StorageRecords& records, const std::string& path)
      : in_(pickle), records_(records), path_(path) {}

  Ref run() {
    while (true) {
      op_at_ = pos_;
      if (pos_ >= in_.size()) fail("it ends without STOP");
      const auto op = static_cast<unsigned char>(in_[pos_++]);
      if (op == '.') break;  // STOP
      step(op);
    }
    if (stack_.size() != 1 || !marks_.empty()) {
      fail(fmt::format("STOP leaves {} values and {} marks, expected one value", stack_.size(), marks_.size()));
    }
    return stack_.back();
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw CheckpointError(fmt::format(
        "{} is damaged, or is not a torch.save'd state dict: {} (byte {} of its data.pkl); restore the file from "
        "a copy, or save the layer again with torch.save(layer.state_dict(), path)",
        path_, what, op_at_));
  }

 private:
  void step(unsigned char op) {
    switch (op) {
      case 0x80: {  // PROTO
        const auto version = fixed<uint8_t>();
        if (version < 2 || version > 5) fail(fmt::format("pickle protocol {}, expected 2 to 5", version));
        break;
      }
      case 0x95: fixed<uint64_t>(); break;  // FRAME: a hint for buffered readers
      case '(': marks_.push_back(stack_.size()); break;
      case '0': pop(); break;  // POP
      case 'N': push(make(Value::Kind::None)); break;
      case 0x88: push(boolean(true)); break;   // NEWTRUE
      case 0x89: push(boolean(false)); break;  // NEWFALSE
      case 'K': push(integer(fixed<uint8_t>())); break;   // BININT1
      case 'M': push(integer(fixed<uint16_t>())); break;  // BININT2
      case 'J': push(integer(fixed<int32_t>())); break;   // BININT
      case 0x8a: push(integer(long1())); break;           // LONG1
      case 'G': push(real(binfloat())); break;            // BINFLOAT
      case 'X': push(string(bytes(fixed<uint32_t>()))); break;  // BINUNICODE
      case 0x8c: push(string(bytes(fixed<uint8_t>()))); break;  // SHORT_BINUNICODE
      case 0x8d: push(string(bytes(fixed<uint64_t>()))); break;  // BINUNICODE8
      case 'c': {  // GLOBAL
        auto module = line();
        auto name = line();
        push(global(module + "." + name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        const auto name = pop_as(Value::Kind::String, "STACK_GLOBAL's name");
        const auto module = pop_as(Value::Kind::String, "STACK_GLOBAL's module");
        push(global(module->s + "." + name->s));
        break;
      }
      case 'q': memoize(fixed<uint8_t>()); break;   // BINPUT
      case 'r': memoize(fixed<uint32_t>()); break;  // LONG_BINPUT
      case 0x94: memoize(memo_.size()); break;      // MEMOIZE
      case 'h': recall(fixed<uint8_t>()); break;    // BINGET
      case 'j': recall(fixed<uint32_t>()); break;   // LONG_BINGET
      case ')': push(make(Value::Kind::Tuple)); break;  // EMPTY_TUPLE
      case 0x85: tuple_of_last(1); break;               // TUPLE1
      case 0x86: tuple_of_last(2); break;               // TUPLE2
      case 0x87: tuple_of_last(3); break;               // TUPLE3
      case 't': tuple_of_last(stack_.size() - pop_mark()); break;  // TUPLE
      case ']': push(make(Value::Kind::List)); break;  // EMPTY_LIST
      case '}': push(make(Value::Kind::Dict)); break;  // EMPTY_DICT
      case 'a': add_to(2, 1, Value::Kind::List); break;  // APPEND
      case 's': add_to(3, 2, Value::Kind::Dict); break;  // SETITEM
      case 'e': {  // APPENDS
        const size_t mark = pop_mark();
        add_to(stack_.size() - mark + 1, stack_.size() - mark, Value::Kind::List);
        break;
      }
      case 'u': {  // SETITEMS
        const size_t mark = pop_mark();
        if ((stack_.size() - mark) % 2 != 0) fail("SETITEMS with a key left without its value");
        add_to(stack_.size() - mark + 1, stack_.size() - mark, Value::Kind::Dict);
        break;
      }
      case 'R': reduce(); break;
      case 'b': {  // BUILD: only a dict's attributes (state_dict()'s _metadata), which nothing here reads
        pop();
        if (top().kind != Value::Kind::Dict) fail(fmt::format("BUILD on {}, expected a dict", name_of(top().kind)));
        break;
      }
      case 'Q': push(storage(pop_as(Value::Kind::Tuple, "BINPERSID's id"))); break;
      default:
        fail(fmt::format("opcode 0x{:02x} ('{}'), which a state dict does not use", op,
                         op >= 0x20 && op < 0x7f ? static_cast<char>(op) : '?'));
    }
  }

  template <typename T>
  T fixed() {  // little-endian, as pickle writes them and as the hosts we support are
    if (in_.size() - pos_ < sizeof(T)) fail("it ends inside an opcode's argument");
    T value;
    std::memcpy(&value, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return value;
  }

  int64_t long1() {
    const auto n = fixed<uint8_t>();
    if (n > 8) fail(fmt::format("LONG1 of {} bytes, more than an int64", n));
    if (in_.size() - pos_ < n) fail("it ends inside LONG1");
    uint64_t value = 0;
    for (int b = 0; b < n; ++b) value |= static_cast<uint64_t>(static_cast<unsigned char>(in_[pos_ + b])) << (8 * b);
    if (n > 0 && n < 8 && (static_cast<unsigned char>(in_[pos_ + n - 1]) & 0x80)) value |= ~uint64_t{0} << (8 * n);
    pos_ += n;
    return static_cast<int64_t>(value);
  }

  double binfloat() {  // big-endian
    if (in_.size() - pos_ < 8) fail("it ends inside BINFLOAT");
    uint64_t bits = 0;
    for (int b = 0; b < 8; ++b) bits = (bits << 8) | static_cast<unsigned char>(in_[pos_ + b]);
    pos_ += 8;
    double value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }

  std::string bytes(uint64_t n) {
    if (in_.size() - pos_ < n) fail(fmt::format("a string of {} bytes where {} are left", n, in_.size() - pos_));
    std::string out = in_.substr(pos_, n);
    pos_ += n;
    return out;
  }

  std::string line() {
    const auto end = in_.find('\n', pos_);
    if (end == std::string::npos || end - pos_ > kMaxNameLength) fail("GLOBAL without a newline-ended name");
    std::string out = in_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return out;
  }

  static Ref make(Value::Kind kind) {
    auto v = std::make_shared<Value>();
    v->kind = kind;
    return v;
  }
  static Ref boolean(bool b) {
    auto v = make(Value::Kind::Bool);
    v->i = b;
    return v;
  }
  static Ref integer(int64_t i) {
    auto v = make(Value::Kind::Int);
    v->i = i;
    return v;
  }
  static Ref real(double f) {
    auto v = make(Value::Kind::Float);
    v->f = f;
    return v;
  }
  static Ref string(std::string s) {
    auto v = make(Value::Kind::String);
    v->s = std::move(s);
    return v;
  }
  static Ref global(std::string name) {
    auto v = make(Value::Kind::Global);
    v->s = std::move(name);
    return v;
  }

  void push(Ref v) { stack_.push_back(std::move(v)); }

  // The values an opcode may use: those above the innermost open MARK (as in Python's pickle,
  // where MARK starts a new stack).
  size_t available() const { return stack_.size() - (marks_.empty() ? 0 : marks_.back()); }

  void need(size_t n, const char* opcode) const {
    if (available() < n) fail(fmt::format("{} needs {} values but the stack holds {}", opcode, n, available()));
  }

  Value& top() {
    need(1, "an opcode");
    return *stack_.back();
  }

  Ref pop() {
    need(1, "an opcode");
    Ref v = std::move(stack_.back());
    stack_.pop_back();
    return v;
  }

  Ref pop_as(Value::Kind kind, const char* what) {
    Ref v = pop();
    if (v->kind != kind) fail(fmt::format("{} is {}, expected {}", what, name_of(v->kind), name_of(kind)));
    return v;
  }

  size_t pop_mark() {
    if (marks_.empty()) fail("an opcode needs a MARK but none is open");
    const size_t mark = marks_.back();
    marks_.pop_back();
    return mark;
  }

  void memoize(size_t index) {
    need(1, "PUT");
    memo_[index] = stack_.back();
  }

  void recall(size_t index) {
    const auto it = memo_.find(index);
    if (it == memo_.end()) fail(fmt::format("memo entry {} was never stored", index));
    push(it->second);
  }

  // Marks `child` as held by a container of depth > its own.
  int adopt(Value& child) {
    child.inside = true;
    if (child.depth + 1 > kMaxDepth) fail(fmt::format("containers nested more than {} deep", kMaxDepth));
    return child.depth + 1;
  }

  // Replaces the last n values by a tuple of them.
  void tuple_of_last(size_t n) {
    need(n, "TUPLE");
    auto t = make(Value::Kind::Tuple);
    for (size_t k = stack_.size() - n; k < stack_.size(); ++k) {
      t->depth = std::max(t->depth, adopt(*stack_[k]));
      t->items.push_back(std::move(stack_[k]));
    }
    stack_.resize(stack_.size() - n);
    push(std::move(t));
  }

  // Moves the last n values into the container `at` values from the top (a list or a dict).
  void add_to(size_t at, size_t n, Value::Kind kind) {
    need(at, kind == Value::Kind::Dict ? "SETITEM" : "APPEND");
    Value& container = *stack_[stack_.size() - at];
    if (container.kind != kind) {
      fail(fmt::format("adding items to {}, expected {}", name_of(container.kind), name_of(kind)));
    }
    if (container.inside) fail(fmt::format("adding items to {} already inside another value", name_of(kind)));
    for (size_t k = stack_.size() - n; k < stack_.size(); ++k) {
      container.depth = std::max(container.depth, adopt(*stack_[k]));
    }
    if (kind == Value::Kind::Dict) {
      for (size_t k = stack_.size() - n; k < stack_.size(); k += 2) set_item(container, stack_[k], stack_[k + 1]);
    } else {
      for (size_t k = stack_.size() - n; k < stack_.size(); ++k) container.items.push_back(std::move(stack_[k]));
    }
    stack_.resize(stack_.size() - n);
  }

  // A dict's later value for a string key replaces the earlier one, as in Python.
  static void set_item(Value& dict, Ref key, Ref value) {
    if (key->kind == Value::Kind::String) {
      for (size_t k = 0; k < dict.items.size(); k += 2) {
        if (dict.items[k]->kind == Value::Kind::String && dict.items[k]->s == key->s) {
          dict.items[k + 1] = std::move(value);
          return;
        }
      }
    }
    dict.items.push_back(std::move(key));
    dict.items.push_back(std::move(value));
  }

  void reduce() {
    const auto args = pop_as(Value::Kind::Tuple, "REDUCE's arguments");
    const auto callable = pop_as(Value::Kind::Global, "REDUCE's callable");
    const auto& a = args->items;
    const std::string& name = callable->s;
    if (name == "collections.OrderedDict") {
      if (!a.empty()) fail("OrderedDict called with arguments");
      push(make(Value::Kind::Dict));
    } else if (name == "torch._utils._rebuild_tensor_v2") {
      if (a.size() != 6 && a.size() != 7) fail(fmt::format("_rebuild_tensor_v2 with {} arguments", a.size()));
      push(rebuild_tensor(a));
    } else if (name == "torch._utils._rebuild_parameter" || name == "torch._utils._rebuild_parameter_with_state") {
      if (a.size() < 3 || a.size() > 4 || a[0]->kind != Value::Kind::Tensor) fail("a parameter without its tensor");
      push(a[0]);
    } else {
      fail(fmt::format("it calls {}, which a state dict does not", name));
    }
  }

  int64_t as_int(const Ref& v, const char* what) const {
    if (v->kind != Value::Kind::Int) fail(fmt::format("{} is {}, expected an int", what, name_of(v->kind)));
    return v->i;
  }

  std::vector<int64_t> int_tuple(const Ref& v, const char* what) const {
    if (v->kind != Value::Kind::Tuple) fail(fmt::format("{} is {}, expected a tuple", what, name_of(v->kind)));
    if (v->items.size() > kMaxTensorDims) fail(fmt::format("{} has {} dimensions", what, v->items.size()));
    std::vector<int64_t> out;
    for (const auto& item : v->items) {
      const int64_t x = as_int(item, what);
      if (x < 0) fail(fmt::format("{} holds {}", what, x));
      out.push_back(x);
    }
    return out;
  }

  // _rebuild_tensor_v2(storage, storage_offset, size, stride, requires_grad, backward_hooks[, metadata]):
  // a view of the storage, after checking that every element it covers lies inside it.
  Ref rebuild_tensor(const std::vector<Ref>& a) {
    if (a[0]->kind != Value::Kind::Storage) {
      fail(fmt::format("a tensor of {}, expected a storage", name_of(a[0]->kind)));
    }
    const torch::Tensor& storage = a[0]->tensor;
    const int64_t offset = as_int(a[1], "a tensor's storage offset");
    const auto size = int_tuple(a[2], "a tensor's size");
    const auto stride = int_tuple(a[3], "a tensor's stride");
    if (size.size() != stride.size()) {
      fail(fmt::format("a tensor of {} sizes and {} strides", size.size(), stride.size()));
    }
    if (offset < 0) fail(fmt::format("a tensor at storage offset {}", offset));
    bool empty = false;
    int64_t last = offset;  // the element furthest into the storage
    for (size_t d = 0; d < size.size(); ++d) {
      if (size[d] == 0) empty = true;
      int64_t reach = 0;
      if (size[d] > 0 && (__builtin_mul_overflow(size[d] - 1, stride[d], &reach) ||
                          __builtin_add_overflow(last, reach, &last))) {
        fail("a tensor whose extent overflows");
      }
    }
    const int64_t available = storage.numel();
    if (empty ? offset > available : last >= available) {
      fail(fmt::format("a tensor of size [{}] and stride [{}] at offset {} reaches past its storage of {} elements",
                       fmt::join(size, ", "), fmt::join(stride, ", "), offset, available));
    }
    auto v = make(Value::Kind::Tensor);
    v->tensor = storage.as_strided(size, stride, offset);
    return v;
  }

  // BINPERSID's ('storage', torch.<Type>Storage, key, location, numel): the archive's record.
  Ref storage(const Ref& id) {
    const auto& a = id->items;
    if (a.size() != 5 || a[0]->kind != Value::Kind::String || a[0]->s != "storage") {
      fail("a persistent id that is not ('storage', type, key, location, numel)");
    }
    if (a[1]->kind != Value::Kind::Global) fail("a storage whose type is not a global");
    const auto dtype = storage_dtype(a[1]->s);
    if (!dtype) fail(fmt::format("a storage of type {}", a[1]->s));
    if (a[2]->kind != Value::Kind::String || a[3]->kind != Value::Kind::String) {
      fail("a storage whose key or location is not a string");
    }
    const std::string& key = a[2]->s;
    if (key.empty() || key.size() > kMaxNameLength ||
        key.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_") != std::string::npos) {
      fail("a storage key that is not a record name");
    }
    const int64_t numel = as_int(a[4], "a storage's size");
    if (numel < 0) fail(fmt::format("a storage of {} elements", numel));
    const auto cached = storages_.find(key);
    if (cached != storages_.end()) {
      if (cached->second->tensor.numel() != numel || cached->second->tensor.scalar_type() != *dtype) {
        fail(fmt::format("storage {} announced twice, differently", key));
      }
      return cached->second;
    }
    const auto item = static_cast<int64_t>(c10::elementSize(*dtype));
    int64_t needed = 0;
    if (__builtin_mul_overflow(numel, item, &needed)) fail(fmt::format("a storage of {} elements", numel));
    auto v = make(Value::Kind::Storage);
    if (numel == 0) {
      v->tensor = torch::empty({0}, torch::TensorOptions().dtype(*dtype));
    } else {
      std::pair<at::DataPtr, size_t> record;
      try {
        record = records_(key);
      } catch (const std::exception&) {
        fail(fmt::format("the record of storage {} is missing", key));
      }
      if (static_cast<int64_t>(record.second) < needed) {
        fail(fmt::format("storage {} holds {} bytes, its {} elements of {} need {}", key, record.second, numel,
                         c10::toString(*dtype), needed));
      }
      auto owner = std::make_shared<at::DataPtr>(std::move(record.first));
      void* data = owner->get();
      v->tensor = torch::from_blob(data, {numel}, [owner](void*) {}, torch::TensorOptions().dtype(*dtype));
    }
    storages_.emplace(key, v);
    return v;
  }

  const std::string& in_;
  const StorageRecords& records_;
  const std::string& path_;
  size_t pos_ = 0;
  size_t op_at_ = 0;
  std::vector<Ref> stack_;
  std::vector<size_t> marks_;
  std::map<size_t, Ref> memo_;
  std::map<std::string, Ref> storages_;
};

}  // namespace

std::vector<std::pair<std::string, torch::Tensor>> read_pickled_state_dict(const std::string& pickle,
                                                                           const StorageRecords& records,
                                                                           const std::string& path) {
  Reader reader(pickle, records, path);
  const Ref value = reader.run();
  if (value->kind != Value::Kind::Dict) {
    reader.fail(fmt::format("it holds {}, not a state dict (name -> tensor)", name_of(value->kind)));
  }
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (size_t k = 0; k < value->items.size(); k += 2) {
    const auto& key = value->items[k];
    const auto& item = value->items[k + 1];
    if (key->kind != Value::Kind::String || item->kind != Value::Kind::Tensor) {
      reader.fail(fmt::format("it maps {} to {}; a state dict maps names to tensors", name_of(key->kind),
                              name_of(item->kind)));
    }
    out.emplace_back(key->s, item->tensor);
  }
  return out;
}

}  // namespace pipetrain::detail
