// sluice::image and sluice::io: the builders of image.h and the expression
// functions they call (expr_functions_internal.h), over the kernels of
// image_kernels.cc.
#include "sluice/dataset/image.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "dataset/dataset.pb.h"
#include "sluice/core/status.h"
#include "sluice/dataset/dataset_internal.h"
#include "sluice/dataset/expr_functions_internal.h"
#include "sluice/dataset/image_kernels_internal.h"

namespace sluice {
namespace {

namespace k = internal::image;
using internal::CallContext;
using internal::ExprFunction;

// io.read_file refuses files larger than this (a corrupt or wrong path
// should not take the worker's memory).
constexpr int64_t kMaxFileBytes = int64_t{1} << 30;

expr::Expr MakeCall(const char* function, std::vector<const expr::Expr*> args,
                    std::vector<int64_t> ints = {}, std::vector<double> floats = {},
                    std::vector<std::string> strings = {}) {
  proto::Expr e;
  auto* c = e.mutable_call();
  c->set_function(function);
  for (const expr::Expr* a : args) *c->add_args() = a->node();
  for (int64_t v : ints) c->add_ints(v);
  for (double v : floats) c->add_floats(v);
  for (auto& v : strings) c->add_strings(std::move(v));
  return expr::Expr(std::make_shared<const proto::Expr>(std::move(e)));
}

// ---- argument checks (at definition time, on possibly unknown specs) ----

absl::Status Invalid(absl::string_view msg) { return absl::InvalidArgumentError(msg); }

absl::Status CheckStringScalar(const ComponentSpec& s, absl::string_view what) {
  if (s.dtype && *s.dtype != DType::kString) {
    return Invalid(absl::StrCat(what, " must be a string scalar; got ", s.ToString()));
  }
  if (s.shape && !s.shape->empty()) {
    return Invalid(absl::StrCat(what, " must be a string scalar; got ", s.ToString()));
  }
  return absl::OkStatus();
}

// A uint8 [H, W, C] image; returns its spec's C (-1 when unknown).
absl::StatusOr<int64_t> CheckImage(const ComponentSpec& s, bool rgb) {
  if (s.dtype && *s.dtype != DType::kUInt8) {
    return Invalid(absl::StrCat("needs a uint8 [H, W, 3] image (from image::Decode); got ",
                                s.ToString()));
  }
  if (!s.shape) return int64_t{-1};
  if (s.shape->size() != 3) {
    return Invalid(absl::StrCat("needs a uint8 [H, W, C] image; got rank ", s.shape->size(),
                                " (", s.ToString(), ")"));
  }
  const int64_t c = (*s.shape)[2];
  if (rgb && c >= 0 && c != 3) {
    return Invalid(absl::StrCat("needs 3 channels; got ", s.ToString()));
  }
  return c;
}

absl::Status CheckAttrs(const proto::Expr::Call& c, int ints, int floats) {
  if (c.ints_size() != ints || c.floats_size() != floats) {
    return Invalid(absl::StrCat("expects ", ints, " integer and ", floats,
                                " float attributes; the definition has ", c.ints_size(), " and ",
                                c.floats_size()));
  }
  return absl::OkStatus();
}

absl::Status CheckSize(int64_t height, int64_t width) {
  if (height < 1 || width < 1 || height > 65535 || width > 65535) {
    return Invalid(absl::StrCat("size must be in [1, 65535]; got ", height, " x ", width));
  }
  return absl::OkStatus();
}

ComponentSpec ScalarSpecOf(DType d) { return ComponentSpec{d, std::vector<int64_t>{}}; }

ComponentSpec ImageSpec(int64_t height, int64_t width, int64_t channels) {
  return ComponentSpec{DType::kUInt8, std::vector<int64_t>{height, width, channels}};
}

// A run's image argument: uint8 rank 3 (the spec may have been unknown).
absl::Status CheckImageTensor(const Tensor& t) {
  if (t.dtype() != DType::kUInt8 || t.shape().rank() != 3) {
    return Invalid(absl::StrCat("needs a uint8 [H, W, C] image; got ", DTypeName(t.dtype()),
                                " of rank ", t.shape().rank()));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string_view> StringScalar(const Tensor& t, absl::string_view what) {
  if (t.dtype() != DType::kString || !t.shape().is_scalar()) {
    return Invalid(absl::StrCat(what, " must be a string scalar"));
  }
  return t.str(0);
}

// ---- io.read_file ----

absl::StatusOr<ComponentSpec> ReadFileInfer(const proto::Expr::Call&,
                                            const std::vector<ComponentSpec>& args) {
  SLUICE_RETURN_IF_ERROR(CheckStringScalar(args[0], "the path"));
  return ScalarSpecOf(DType::kString);
}

absl::Status ErrnoStatus(int err, absl::string_view what) {
  std::string msg = absl::StrCat(what, ": ", std::strerror(err));
  if (err == ENOENT || err == ENOTDIR) return absl::NotFoundError(msg);
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(msg);
  if (err == EISDIR) return absl::InvalidArgumentError(msg);
  return absl::UnavailableError(msg);
}

absl::StatusOr<Tensor> ReadFileRun(const proto::Expr::Call&, const std::vector<Tensor>& args,
                                   const CallContext& ctx) {
  SLUICE_ASSIGN_OR_RETURN(std::string_view path, StringScalar(args[0], "the path"));
  *ctx.origin = std::string(path);  // later errors of this element name it
  const int fd = ::open(std::string(path).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoStatus(errno, "cannot open");
  struct stat st {};
  std::string bytes;
  absl::Status s;
  if (::fstat(fd, &st) != 0) {
    s = ErrnoStatus(errno, "cannot stat");
  } else if (S_ISDIR(st.st_mode)) {
    s = absl::InvalidArgumentError("is a directory");
  } else if (st.st_size > kMaxFileBytes) {
    s = absl::ResourceExhaustedError(
        absl::StrCat("is ", st.st_size, " bytes; io::ReadFile reads files up to ", kMaxFileBytes));
  } else {
    bytes.resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (s.ok() && done < bytes.size()) {
      const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) s = ErrnoStatus(errno, "cannot read");
      if (n == 0) bytes.resize(done);  // it shrank meanwhile
      if (n <= 0) break;
      done += static_cast<size_t>(n);
    }
  }
  ::close(fd);
  SLUICE_RETURN_IF_ERROR(s);
  return Tensor::String(bytes);
}

// ---- image.decode ----

absl::StatusOr<ComponentSpec> DecodeInfer(const proto::Expr::Call&,
                                          const std::vector<ComponentSpec>& args) {
  SLUICE_RETURN_IF_ERROR(CheckStringScalar(args[0], "the encoded image"));
  return ImageSpec(-1, -1, 3);
}

absl::StatusOr<Tensor> DecodeRun(const proto::Expr::Call&, const std::vector<Tensor>& args,
                                 const CallContext&) {
  SLUICE_ASSIGN_OR_RETURN(std::string_view bytes, StringScalar(args[0], "the encoded image"));
  return k::DecodeImage(bytes);
}

// The image argument of a function that takes encoded input over: decoded
// per `plan` (which sees the image's size) when it is the bytes, else
// passed to `plan` as is. `plan` returns the request for a decode.
template <typename Plan, typename Apply>
absl::StatusOr<Tensor> OnImage(const Tensor& arg, const CallContext& ctx, Plan plan,
                               Apply apply) {
  if (ctx.encoded_input) {
    SLUICE_ASSIGN_OR_RETURN(std::string_view bytes, StringScalar(arg, "the encoded image"));
    SLUICE_ASSIGN_OR_RETURN(k::ImageInfo info, k::PeekImage(bytes));
    k::DecodeRequest req = plan(info.height, info.width);
    SLUICE_ASSIGN_OR_RETURN(Tensor img, k::DecodeImage(bytes, req));
    return apply(img, /*cropped=*/req.region.has_value());
  }
  SLUICE_RETURN_IF_ERROR(CheckImageTensor(arg));
  return apply(arg, /*cropped=*/false);
}

// ---- image.random_resized_crop: ints {height, width}, floats {scale, ratio} ----

absl::StatusOr<ComponentSpec> RandomResizedCropInfer(const proto::Expr::Call& c,
                                                     const std::vector<ComponentSpec>& args) {
  SLUICE_RETURN_IF_ERROR(CheckAttrs(c, 2, 4));
  SLUICE_RETURN_IF_ERROR(CheckSize(c.ints(0), c.ints(1)));
  const double s0 = c.floats(0), s1 = c.floats(1), r0 = c.floats(2), r1 = c.floats(3);
  if (!(s0 > 0 && s0 <= s1 && s1 <= 1)) {
    return Invalid(absl::StrCat("scale must satisfy 0 < min <= max <= 1; got (", s0, ", ", s1, ")"));
  }
  if (!(r0 > 0 && r0 <= r1 && std::isfinite(r1))) {
    return Invalid(absl::StrCat("ratio must satisfy 0 < min <= max; got (", r0, ", ", r1, ")"));
  }
  SLUICE_ASSIGN_OR_RETURN(int64_t ch, CheckImage(args[0], false));
  return ImageSpec(c.ints(0), c.ints(1), ch);
}

absl::StatusOr<Tensor> RandomResizedCropRun(const proto::Expr::Call& c,
                                            const std::vector<Tensor>& args,
                                            const CallContext& ctx) {
  const int64_t h = c.ints(0), w = c.ints(1);
  k::Rng rng(ctx.seed);
  k::Region box;
  auto plan = [&](int64_t height, int64_t width) {
    box = k::RandomResizedCropRegion(rng, height, width, {c.floats(0), c.floats(1)},
                                     {c.floats(2), c.floats(3)});
    return k::DecodeRequest{box, h, w};
  };
  return OnImage(args[0], ctx, plan, [&](const Tensor& img, bool cropped) -> absl::StatusOr<Tensor> {
    if (cropped) return k::Resize(img, h, w);
    plan(img.shape().dims()[0], img.shape().dims()[1]);
    SLUICE_ASSIGN_OR_RETURN(Tensor crop, k::Crop(img, box));
    return k::Resize(crop, h, w);
  });
}

// ---- image.resize: ints {shorter_side} ----

absl::StatusOr<ComponentSpec> ResizeInfer(const proto::Expr::Call& c,
                                          const std::vector<ComponentSpec>& args) {
  SLUICE_RETURN_IF_ERROR(CheckAttrs(c, 1, 0));
  SLUICE_RETURN_IF_ERROR(CheckSize(c.ints(0), c.ints(0)));
  SLUICE_ASSIGN_OR_RETURN(int64_t ch, CheckImage(args[0], false));
  return ImageSpec(-1, -1, ch);
}

absl::StatusOr<Tensor> ResizeRun(const proto::Expr::Call& c, const std::vector<Tensor>& args,
                                 const CallContext& ctx) {
  const int64_t side = c.ints(0);
  // The size from the image's full-resolution dims: a scaled decode keeps
  // the aspect ratio only to a pixel.
  std::optional<std::array<int64_t, 2>> size;
  auto plan = [&](int64_t height, int64_t width) {
    size = k::ResizedSize(height, width, side);
    return k::DecodeRequest{std::nullopt, (*size)[0], (*size)[1]};
  };
  return OnImage(args[0], ctx, plan, [&](const Tensor& img, bool) {
    if (!size) size = k::ResizedSize(img.shape().dims()[0], img.shape().dims()[1], side);
    return k::Resize(img, (*size)[0], (*size)[1]);
  });
}

// ---- image.center_crop: ints {height, width} ----

absl::StatusOr<ComponentSpec> CenterCropInfer(const proto::Expr::Call& c,
                                              const std::vector<ComponentSpec>& args) {
  SLUICE_RETURN_IF_ERROR(CheckAttrs(c, 2, 0));
  SLUICE_RETURN_IF_ERROR(CheckSize(c.ints(0), c.ints(1)));
  SLUICE_ASSIGN_OR_RETURN(int64_t ch, CheckImage(args[0], false));
  return ImageSpec(c.ints(0), c.ints(1), ch);
}

absl::StatusOr<Tensor> CenterCropRun(const proto::Expr::Call& c, const std::vector<Tensor>& args,
                                     const CallContext&) {
  SLUICE_RETURN_IF_ERROR(CheckImageTensor(args[0]));
  return k::CenterCrop(args[0], c.ints(0), c.ints(1));
}

// ---- image.random_horizontal_flip: floats {p} ----

absl::StatusOr<ComponentSpec> FlipInfer(const proto::Expr::Call& c,
                                        const std::vector<ComponentSpec>& args) {
  SLUICE_RETURN_IF_ERROR(CheckAttrs(c, 0, 1));
  if (!(c.floats(0) >= 0 && c.floats(0) <= 1)) {
    return Invalid(absl::StrCat("p must be in [0, 1]; got ", c.floats(0)));
  }
  const ComponentSpec& s = args[0];
  const bool batch = s.shape && s.shape->size() == 4;
  if (batch && s.dtype && *s.dtype != DType::kUInt8) {
    return Invalid(absl::StrCat("needs uint8 images [H, W, C] or a batch [B, H, W, C]; got ",
                                s.ToString()));
  }
  if (!batch) SLUICE_RETURN_IF_ERROR(CheckImage(args[0], false).status());
  return ComponentSpec{DType::kUInt8, args[0].shape};
}

// A batch [B, H, W, C] (after Batch, or after Distribute of uint8
// batches): image b draws from Mix(seed, b), so the same batch (whose key
// comes from its images') flips the same images.
absl::StatusOr<Tensor> FlipRun(const proto::Expr::Call& c, const std::vector<Tensor>& args,
                               const CallContext& ctx) {
  if (args[0].dtype() == DType::kUInt8 && args[0].shape().rank() == 4) {
    std::vector<bool> flip(static_cast<size_t>(args[0].shape().dim(0)));
    for (size_t b = 0; b < flip.size(); ++b) {
      k::Rng rng(internal::Mix(ctx.seed, b));
      flip[b] = rng.Uniform(0, 1) < c.floats(0);
    }
    return k::FlipHorizontalBatch(args[0], flip);
  }
  SLUICE_RETURN_IF_ERROR(CheckImageTensor(args[0]));
  k::Rng rng(ctx.seed);
  if (rng.Uniform(0, 1) < c.floats(0)) return k::FlipHorizontal(args[0]);
  return args[0];
}

// ---- image.normalize: floats {mean[3], stddev[3]} ----

absl::StatusOr<ComponentSpec> NormalizeInfer(const proto::Expr::Call& c,
                                             const std::vector<ComponentSpec>& args) {
  SLUICE_RETURN_IF_ERROR(CheckAttrs(c, 0, 6));
  for (int i = 3; i < 6; ++i) {
    if (c.floats(i) == 0 || !std::isfinite(c.floats(i))) {
      return Invalid(absl::StrCat("stddev must be finite and nonzero; got ", c.floats(i)));
    }
  }
  // An image [H, W, 3] -> [3, H, W], or a batch [B, H, W, 3] -> [B, 3, H, W].
  const ComponentSpec& a = args[0];
  if (a.shape && a.shape->size() == 4) {
    if (a.dtype && *a.dtype != DType::kUInt8) {
      return Invalid(absl::StrCat("needs uint8 images; got ", a.ToString()));
    }
    const std::vector<int64_t>& d = *a.shape;
    if (d[3] >= 0 && d[3] != 3) return Invalid(absl::StrCat("needs 3 channels; got ", a.ToString()));
    return ComponentSpec{DType::kFloat32, std::vector<int64_t>{d[0], 3, d[1], d[2]}};
  }
  SLUICE_RETURN_IF_ERROR(CheckImage(a, true).status());
  std::vector<int64_t> shape = {3, -1, -1};
  if (a.shape) shape = {3, (*a.shape)[0], (*a.shape)[1]};
  return ComponentSpec{DType::kFloat32, shape};
}

absl::StatusOr<Tensor> NormalizeRun(const proto::Expr::Call& c, const std::vector<Tensor>& args,
                                    const CallContext&) {
  std::array<float, 3> mean, stddev;
  for (int i = 0; i < 3; ++i) {
    mean[i] = static_cast<float>(c.floats(i));
    stddev[i] = static_cast<float>(c.floats(3 + i));
  }
  return k::Normalize(args[0], mean, stddev);
}

// ---- image.folder_label: ints {number of classes[, 1: by root]},
// strings {classes..., extensions...[, root]} ----

absl::StatusOr<ComponentSpec> FolderLabelInfer(const proto::Expr::Call& c,
                                               const std::vector<ComponentSpec>& args) {
  if (c.ints_size() == 2) {
    if (c.ints(1) != 1 || c.floats_size() != 0) return Invalid("malformed root attribute");
  } else {
    SLUICE_RETURN_IF_ERROR(CheckAttrs(c, 1, 0));
  }
  if (c.ints(0) < 0 || c.ints(0) + (c.ints_size() == 2 ? 1 : 0) > c.strings_size()) {
    return Invalid(absl::StrCat("names ", c.ints(0), " classes but has ", c.strings_size(),
                                " strings"));
  }
  SLUICE_RETURN_IF_ERROR(CheckStringScalar(args[0], "the path"));
  return ScalarSpecOf(DType::kInt64);
}

absl::StatusOr<Tensor> FolderLabelRun(const proto::Expr::Call& c, const std::vector<Tensor>& args,
                                      const CallContext&) {
  SLUICE_ASSIGN_OR_RETURN(std::string_view path, StringScalar(args[0], "the path"));
  const size_t slash = path.rfind('/');
  const std::string_view file = slash == std::string_view::npos ? path : path.substr(slash + 1);
  const std::string_view dir = slash == std::string_view::npos ? "" : path.substr(0, slash);
  // The class: the parent directory's name or, by root, the first
  // directory below the root (images deeper in a class directory count).
  std::string_view parent = dir.substr(dir.rfind('/') == std::string_view::npos
                                           ? 0
                                           : dir.rfind('/') + 1);
  const bool by_root = c.ints_size() == 2;
  int strings_end = c.strings_size();
  if (by_root) {
    const std::string& root = c.strings(--strings_end);
    if (dir.size() <= root.size() || dir.compare(0, root.size(), root) != 0 ||
        dir[root.size()] != '/') {
      return Tensor::Scalar<int64_t>(-1);  // not under the root
    }
    const std::string_view below = dir.substr(root.size() + 1);
    parent = below.substr(0, below.find('/'));
  }
  const int num_classes = static_cast<int>(c.ints(0));
  const size_t dot = file.rfind('.');
  const std::string ext =
      dot == std::string_view::npos ? "" : absl::AsciiStrToLower(std::string(file.substr(dot)));
  bool ext_ok = false;
  for (int i = num_classes; i < strings_end && !ext_ok; ++i) ext_ok = ext == c.strings(i);
  int64_t label = -1;
  for (int i = 0; ext_ok && i < num_classes; ++i) {
    if (c.strings(i) == parent) {
      label = i;
      break;
    }
  }
  return Tensor::Scalar<int64_t>(label);
}

}  // namespace

// ---- the functions (listed in expr_functions.cc) ----
namespace internal {
extern const ExprFunction kReadFileFunction = {
    .name = "io.read_file", .num_args = 1, .infer = &ReadFileInfer, .run = &ReadFileRun};
extern const ExprFunction kDecodeImageFunction = {
    .name = "image.decode", .num_args = 1, .infer = &DecodeInfer, .run = &DecodeRun};
extern const ExprFunction kRandomResizedCropFunction = {
    .name = "image.random_resized_crop", .num_args = 1, .random = true,
    .takes_encoded_input = true, .infer = &RandomResizedCropInfer, .run = &RandomResizedCropRun};
extern const ExprFunction kResizeFunction = {
    .name = "image.resize", .num_args = 1, .takes_encoded_input = true, .infer = &ResizeInfer,
    .run = &ResizeRun};
extern const ExprFunction kCenterCropFunction = {
    .name = "image.center_crop", .num_args = 1, .infer = &CenterCropInfer, .run = &CenterCropRun};
extern const ExprFunction kRandomHorizontalFlipFunction = {
    .name = "image.random_horizontal_flip", .num_args = 1, .random = true, .infer = &FlipInfer,
    .run = &FlipRun};
extern const ExprFunction kNormalizeFunction = {
    .name = "image.normalize", .num_args = 1, .infer = &NormalizeInfer, .run = &NormalizeRun};
extern const ExprFunction kFolderLabelFunction = {
    .name = "image.folder_label", .num_args = 1, .infer = &FolderLabelInfer,
    .run = &FolderLabelRun};
}  // namespace internal

// ---- builders ----

namespace io {
expr::Expr ReadFile(const expr::Expr& path) { return MakeCall("io.read_file", {&path}); }
}  // namespace io

namespace image {

expr::Expr Decode(const expr::Expr& bytes) { return MakeCall("image.decode", {&bytes}); }

expr::Expr RandomResizedCrop(const expr::Expr& img, int64_t height, int64_t width,
                             std::array<double, 2> scale, std::array<double, 2> ratio) {
  return MakeCall("image.random_resized_crop", {&img}, {height, width},
                  {scale[0], scale[1], ratio[0], ratio[1]});
}

expr::Expr Resize(const expr::Expr& img, int64_t shorter_side) {
  return MakeCall("image.resize", {&img}, {shorter_side});
}

expr::Expr CenterCrop(const expr::Expr& img, int64_t height, int64_t width) {
  return MakeCall("image.center_crop", {&img}, {height, width});
}

expr::Expr RandomHorizontalFlip(const expr::Expr& img, double p) {
  return MakeCall("image.random_horizontal_flip", {&img}, {}, {p});
}

expr::Expr Normalize(const expr::Expr& img, std::array<float, 3> mean,
                     std::array<float, 3> stddev) {
  return MakeCall("image.normalize", {&img}, {},
                  {mean[0], mean[1], mean[2], stddev[0], stddev[1], stddev[2]});
}

absl::StatusOr<std::vector<std::string>> FolderClasses(const std::string& root) {
  std::error_code ec;
  std::filesystem::directory_iterator it(root, ec);
  if (ec) {
    return absl::NotFoundError(
        absl::StrCat("image folder '", root, "' cannot be listed: ", ec.message()));
  }
  std::vector<std::string> classes;
  for (const auto& entry : it) {
    if (entry.is_directory(ec)) classes.push_back(entry.path().filename().string());
  }
  if (classes.empty()) {
    return absl::NotFoundError(absl::StrCat("image folder '", root,
                                            "' has no class subdirectories (root/<class>/<image>)"));
  }
  std::sort(classes.begin(), classes.end());
  return classes;
}

expr::Expr FolderLabel(const expr::Expr& path, const std::vector<std::string>& classes,
                       const std::vector<std::string>& extensions, const std::string& root) {
  std::vector<std::string> strings = classes;
  for (const auto& e : extensions) strings.push_back(absl::AsciiStrToLower(e));
  std::vector<int64_t> ints = {static_cast<int64_t>(classes.size())};
  if (!root.empty()) {
    strings.push_back(root);
    ints.push_back(1);
  }
  return MakeCall("image.folder_label", {&path}, std::move(ints), {}, std::move(strings));
}

Dataset ImageFolder(const std::string& root, const std::vector<std::string>& extensions) {
  auto classes = FolderClasses(root);
  if (!classes.ok()) return internal::MakeErrorDataset(classes.status());
  using expr::x;
  // Every file under the class directories, at any depth, labeled by the
  // class directory it is under (torchvision walks them the same way).
  std::string base = root;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return Dataset::ListFiles(absl::StrCat(base, "/*"), /*recursive=*/true)
      .Map({x, FolderLabel(x, *classes, extensions, base)})
      .Filter(x[1] >= 0);
}

}  // namespace image
}  // namespace sluice
