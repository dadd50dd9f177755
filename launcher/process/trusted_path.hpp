#pragma once
// Whether code may be loaded from a path into every worker: only when no user but root and
// the one running ddprun can change what is there, by the rule OpenSSH applies to the files
// it trusts. ddprun's Python probe and its NCCL profiler plugin are loaded only from paths
// that pass. Internal to the launcher.

#include <sys/types.h>

#include <filesystem>
#include <optional>
#include <string>

namespace ddp::launcher {

// A path another user could change, and how to make it safe.
struct UntrustedPath {
  std::filesystem::path path;  // the file or folder at fault
  std::string why;             // "is writable by its group (gid 100)", "is owned by uid 1001, ..."
  std::string fix;             // "chmod g-w /srv/ddprun"
  // One line's worth: "<path> <why>; <fix>".
  std::string text() const;
};

// The first part of `path` (made canonical), from / down, that another user could change: a
// part owned by neither root nor `user`, or writable by its group or every user. A folder
// above `path` may be writable by every user when it is sticky (/tmp: only the owner of an
// entry may rename or remove it). nullopt when none; a path that cannot be examined is
// untrusted too (why says so).
std::optional<UntrustedPath> untrusted_path(const std::filesystem::path& path, uid_t user);

// The same for `folder`, then for everything in it (its subfolders' contents too: a
// __pycache__), by the same rule without the sticky exception; a symbolic link in it is
// followed: its target's path is checked, and a linked folder's contents.
std::optional<UntrustedPath> untrusted_folder(const std::filesystem::path& folder, uid_t user);

}  // namespace ddp::launcher
