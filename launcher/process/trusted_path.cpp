#include "process/trusted_path.hpp"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <system_error>

namespace ddp::launcher {
namespace fs = std::filesystem;

namespace {

constexpr int kMaxLinkDepth = 4;  // links to folders followed inside a folder checked

// What is wrong with one part, by its lstat; nullopt when nothing. `above`: a folder above the
// path checked, which may be sticky and writable by every user.
std::optional<UntrustedPath> untrusted_part(const fs::path& part, uid_t user, bool above) {
  struct stat info {};
  if (::lstat(part.c_str(), &info) != 0) {
    return UntrustedPath{part, std::string("cannot be examined (") + std::strerror(errno) + ")",
                         "check that it exists and that you may read it"};
  }
  if (info.st_uid != 0 && info.st_uid != user) {
    return UntrustedPath{part,
                         "is owned by uid " + std::to_string(info.st_uid) +
                             ", neither root nor you (uid " + std::to_string(user) + ")",
                         "make root or you its owner (chown)"};
  }
  const bool sticky_folder = S_ISDIR(info.st_mode) && (info.st_mode & S_ISVTX) != 0;
  if (above && sticky_folder) return std::nullopt;
  const bool group = (info.st_mode & S_IWGRP) != 0, others = (info.st_mode & S_IWOTH) != 0;
  if (!group && !others) return std::nullopt;
  const std::string who = std::string(group ? "g" : "") + (others ? "o" : "");
  return UntrustedPath{
      part,
      others ? "is writable by every user"
             : "is writable by its group (gid " + std::to_string(info.st_gid) + ")",
      "make it writable by its owner only (chmod " + who + "-w " + part.string() + ")"};
}

}  // namespace

std::string UntrustedPath::text() const { return path.string() + " " + why + "; " + fix; }

std::optional<UntrustedPath> untrusted_path(const fs::path& path, uid_t user) {
  std::error_code ec;
  const fs::path canonical = fs::canonical(path, ec);
  if (ec) {
    return UntrustedPath{path, "cannot be examined (" + ec.message() + ")",
                         "check that it exists and that you may read it"};
  }
  fs::path part;
  for (auto name = canonical.begin(); name != canonical.end(); ++name) {
    part /= *name;
    const bool above = std::next(name) != canonical.end();
    if (auto untrusted = untrusted_part(part, user, above)) return untrusted;
  }
  return std::nullopt;
}

namespace {

// untrusted_folder, `depth` links deep (a link to a folder is followed, so far).
std::optional<UntrustedPath> untrusted_tree(const fs::path& folder, uid_t user, int depth) {
  if (auto untrusted = untrusted_path(folder, user)) return untrusted;
  std::error_code ec;
  const fs::path canonical = fs::canonical(folder, ec);
  fs::recursive_directory_iterator entry(canonical, ec), end;
  for (; !ec && entry != end; entry.increment(ec)) {
    const fs::path& path = entry->path();
    std::optional<UntrustedPath> untrusted;
    if (!entry->is_symlink(ec)) {
      untrusted = untrusted_part(path, user, false);
    } else if (!fs::is_directory(path, ec)) {
      untrusted = untrusted_path(path, user);
    } else if (depth < kMaxLinkDepth) {
      untrusted = untrusted_tree(path, user, depth + 1);
    } else {
      untrusted = UntrustedPath{path, "links to folders too deep", "copy the files in"};
    }
    if (untrusted) return untrusted;
  }
  if (ec) {
    return UntrustedPath{canonical, "cannot be listed (" + ec.message() + ")",
                         "check that you may read it"};
  }
  return std::nullopt;
}

}  // namespace

std::optional<UntrustedPath> untrusted_folder(const fs::path& folder, uid_t user) {
  return untrusted_tree(folder, user, 0);
}

}  // namespace ddp::launcher
