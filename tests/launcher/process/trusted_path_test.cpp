// Which paths ddprun trusts to load code from into its workers: every part from / down owned
// by root or the user and writable by nobody else, a sticky folder above aside. "Another user"
// is simulated by chown to a uid no one has (the tests run as root, or skip).
#include "process/trusted_path.hpp"

#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>

#include "skip.hpp"
#include "test_support.hpp"

using namespace ddp::launcher;
namespace fs = std::filesystem;

namespace {

constexpr uid_t kOtherUser = 4242;  // a uid no one here has
constexpr auto kGroupWrite = fs::perms::group_write;
constexpr auto kOthersWrite = fs::perms::others_write;

// <temp>/a/b/c/file, each writable by its owner only.
struct Tree {
  ddp::test::TempDir dir;
  fs::path a = dir.path() / "a", b = a / "b", c = b / "c", file = c / "file";
  Tree() {
    fs::create_directories(c);
    std::ofstream(file) << "code";
    for (const fs::path& p : {dir.path(), a, b, c}) fs::permissions(p, fs::perms(0755));
    fs::permissions(file, fs::perms(0644));
  }
};

void add(const fs::path& path, fs::perms perms) {
  fs::permissions(path, perms, fs::perm_options::add);
}

}  // namespace

TEST_CASE("trusted path: a tree of the user's, writable by its owner only, is trusted") {
  Tree tree;
  CHECK_FALSE(untrusted_path(tree.file, ::geteuid()));
  CHECK_FALSE(untrusted_folder(tree.a, ::geteuid()));
}

TEST_CASE("trusted path: a group-writable part anywhere on the way is refused, named") {
  Tree tree;
  add(tree.b, kGroupWrite);
  const auto untrusted = untrusted_path(tree.file, ::geteuid());
  REQUIRE(untrusted);
  CHECK(untrusted->path == tree.b);
  CHECK_THAT(untrusted->why, Catch::StartsWith("is writable by its group (gid "));
  CHECK(untrusted->fix == "make it writable by its owner only (chmod g-w " + tree.b.string() + ")");
  CHECK_THAT(untrusted->text(), Catch::StartsWith(tree.b.string() + " is writable by its group"));
}

TEST_CASE("trusted path: the file itself group- or world-writable is refused") {
  Tree tree;
  SECTION("group") { add(tree.file, kGroupWrite); }
  SECTION("every user") { add(tree.file, kOthersWrite); }
  const auto untrusted = untrusted_path(tree.file, ::geteuid());
  REQUIRE(untrusted);
  CHECK(untrusted->path == tree.file);
}

TEST_CASE(
    "trusted path: a part owned by another user is refused, and trusted when run as that user") {
  if (::geteuid() != 0) return ddp::test::skip("chown to another user needs root");
  Tree tree;
  REQUIRE(::chown(tree.b.c_str(), kOtherUser, static_cast<gid_t>(-1)) == 0);
  const auto untrusted = untrusted_path(tree.file, ::geteuid());
  REQUIRE(untrusted);
  CHECK(untrusted->path == tree.b);
  CHECK_THAT(untrusted->why, Catch::StartsWith("is owned by uid 4242, neither root nor you"));
  // Run as uid 4242, the same tree is theirs (the rest is root's).
  CHECK_FALSE(untrusted_path(tree.file, kOtherUser));
}

TEST_CASE("trusted path: a sticky folder above may be writable by every user, not the path") {
  Tree tree;
  fs::permissions(tree.a, fs::perms(01777));  // as /tmp
  CHECK_FALSE(untrusted_path(tree.file, ::geteuid()));
  // The folder checked itself gets no such exception, nor a folder without the sticky bit.
  CHECK(untrusted_path(tree.a, ::geteuid()));
  fs::permissions(tree.a, fs::perms(0777));
  CHECK(untrusted_path(tree.file, ::geteuid()));
}

TEST_CASE("trusted path: a symbolic link is judged by where it leads") {
  Tree tree;
  const fs::path link = tree.dir.path() / "link";
  fs::create_symlink(tree.file, link);
  CHECK_FALSE(untrusted_path(link, ::geteuid()));
  add(tree.c, kGroupWrite);
  const auto untrusted = untrusted_path(link, ::geteuid());
  REQUIRE(untrusted);
  CHECK(untrusted->path == tree.c);
}

TEST_CASE("trusted path: a folder's contents are checked too, a __pycache__'s included") {
  Tree tree;
  const fs::path cache = tree.c / "__pycache__";
  fs::create_directory(cache);
  fs::permissions(cache, fs::perms(0755));
  const fs::path pyc = cache / "sitecustomize.cpython-311.pyc";
  std::ofstream(pyc) << "byte-code";
  fs::permissions(pyc, fs::perms(0644));
  CHECK_FALSE(untrusted_folder(tree.c, ::geteuid()));
  SECTION("a group-writable byte-code file") {
    add(pyc, kGroupWrite);
    const auto untrusted = untrusted_folder(tree.c, ::geteuid());
    REQUIRE(untrusted);
    CHECK(untrusted->path == pyc);
  }
  SECTION("a __pycache__ writable by every user, even sticky") {
    fs::permissions(cache, fs::perms(01777));
    const auto untrusted = untrusted_folder(tree.c, ::geteuid());
    REQUIRE(untrusted);
    CHECK(untrusted->path == cache);
  }
  SECTION("a byte-code file planted by another user") {
    if (::geteuid() != 0) return ddp::test::skip("chown to another user needs root");
    REQUIRE(::chown(pyc.c_str(), kOtherUser, static_cast<gid_t>(-1)) == 0);
    const auto untrusted = untrusted_folder(tree.c, ::geteuid());
    REQUIRE(untrusted);
    CHECK(untrusted->path == pyc);
  }
  SECTION("a link in it to a folder with a group-writable file") {
    const fs::path elsewhere = tree.dir.path() / "elsewhere";
    fs::create_directory(elsewhere);
    fs::permissions(elsewhere, fs::perms(0755));
    std::ofstream(elsewhere / "mod.py") << "code";
    fs::permissions(elsewhere / "mod.py", fs::perms(0664));
    fs::create_directory_symlink(elsewhere, tree.c / "linked");
    const auto untrusted = untrusted_folder(tree.c, ::geteuid());
    REQUIRE(untrusted);
    CHECK(untrusted->path == elsewhere / "mod.py");
  }
}

TEST_CASE("trusted path: a missing path is untrusted, and says so") {
  Tree tree;
  const auto untrusted = untrusted_path(tree.c / "missing", ::geteuid());
  REQUIRE(untrusted);
  CHECK_THAT(untrusted->why, Catch::StartsWith("cannot be examined"));
}
