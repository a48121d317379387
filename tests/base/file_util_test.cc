#include "src/base/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/testing/files.h"
#include "tests/testing/status_matchers.h"

namespace snapfill {
namespace {

using ::testing::HasSubstr;
using ::snapfill::testing::ListDir;
using ::snapfill::testing::ReadAll;
using ::snapfill::testing::WriteRaw;



bool Exists(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0;
}


class FileUtilTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string tmpl = ::testing::TempDir() + "/file_util_test.XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl.data()), nullptr) << std::strerror(errno);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  std::string Path(const std::string& name) const { return dir_ + "/" + name; }

  std::string dir_;
};

TEST_F(FileUtilTest, WritesNewFileAndLeavesNoTemporary) {
  const std::string path = Path("out.bin");
  const std::string data("hello\0world", 11);
  SNAPFILL_ASSERT_OK(WriteFileAtomically(path, data, /*overwrite=*/false));
  EXPECT_EQ(ReadAll(path), data);
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"out.bin"});
}

// ReadAllAt reads exactly the bytes asked for at an offset, whatever the
// file position, and names the file when it ends first.
TEST_F(FileUtilTest, ReadAllAtReadsTheRangeOrSaysTheFileEnded) {
  const std::string path = Path("in.bin");
  std::string data(300000, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<char>(i * 7 + i / 256);
  WriteRaw(path, data);
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  std::string got(200000, '\0');
  SNAPFILL_ASSERT_OK(ReadAllAt(fd, got.data(), got.size(), 99999, path));
  EXPECT_EQ(got, data.substr(99999, 200000));
  EXPECT_EQ(::lseek(fd, 0, SEEK_CUR), 0) << "the file position moved";
  const absl::Status past = ReadAllAt(fd, got.data(), 10, data.size() - 5, path);
  EXPECT_EQ(past.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(past.message()), HasSubstr(path));
  ::close(fd);
  EXPECT_FALSE(ReadAllAt(fd, got.data(), 1, 0, path).ok()) << "a closed descriptor";
}

TEST_F(FileUtilTest, RelativePathInCurrentDirectory) {
  char cwd[4096];
  ASSERT_NE(::getcwd(cwd, sizeof(cwd)), nullptr);
  ASSERT_EQ(::chdir(dir_.c_str()), 0);
  const absl::Status s = WriteFileAtomically("relative.bin", "abc", false);
  ASSERT_EQ(::chdir(cwd), 0);
  SNAPFILL_ASSERT_OK(s);
  EXPECT_EQ(ReadAll(Path("relative.bin")), "abc");
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"relative.bin"});
}

TEST_F(FileUtilTest, WritesAcrossBufferBoundaries) {
  // Pieces smaller than, equal to and larger than the 1 MiB buffer, in an
  // order that exercises every branch of Write().
  std::string expected;
  const std::vector<size_t> pieces = {1, 1000, (1 << 20) - 1001, 7, 3 << 20, 5, 1 << 20, 13};
  auto writer = AtomicFileWriter::Create(Path("big.bin"), false);
  SNAPFILL_ASSERT_OK(writer);
  uint32_t state = 12345;
  for (size_t n : pieces) {
    std::string piece(n, '\0');
    for (char& c : piece) {
      state = state * 1664525u + 1013904223u;
      c = static_cast<char>(state >> 24);
    }
    SNAPFILL_ASSERT_OK((*writer)->Write(piece));
    expected += piece;
  }
  EXPECT_EQ((*writer)->bytes_written(), expected.size());
  EXPECT_FALSE(Exists(Path("big.bin"))) << "target must not appear before Commit()";
  SNAPFILL_ASSERT_OK((*writer)->Commit());
  EXPECT_TRUE(ReadAll(Path("big.bin")) == expected);
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"big.bin"});
}

TEST_F(FileUtilTest, TemporaryIsHiddenInTargetDirectory) {
  auto writer = AtomicFileWriter::Create(Path("t.bin"), false);
  SNAPFILL_ASSERT_OK(writer);
  EXPECT_EQ((*writer)->temp_path(),
            absl::StrCat(dir_, "/.t.bin.tmp.", ::getpid()));
  EXPECT_TRUE(Exists((*writer)->temp_path()));
  // A second writer for the same target in this process gets its own file.
  auto second = AtomicFileWriter::Create(Path("t.bin"), false);
  SNAPFILL_ASSERT_OK(second);
  EXPECT_NE((*second)->temp_path(), (*writer)->temp_path());
}

TEST_F(FileUtilTest, ExistingTargetIsNotOverwrittenWithoutForce) {
  const std::string path = Path("keep.bin");
  WriteRaw(path, "original");
  const absl::Status s = WriteFileAtomically(path, "replacement", /*overwrite=*/false);
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path + " exists; use --force to overwrite"));
  EXPECT_EQ(ReadAll(path), "original");
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"keep.bin"});
}

TEST_F(FileUtilTest, OverwriteReplacesTarget) {
  const std::string path = Path("replace.bin");
  WriteRaw(path, "a much longer original content");
  SNAPFILL_ASSERT_OK(WriteFileAtomically(path, "new", /*overwrite=*/true));
  EXPECT_EQ(ReadAll(path), "new");
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"replace.bin"});
}

TEST_F(FileUtilTest, OverwriteKeepsOldContentUntilCommit) {
  const std::string path = Path("replace.bin");
  WriteRaw(path, "old");
  auto writer = AtomicFileWriter::Create(path, true);
  SNAPFILL_ASSERT_OK(writer);
  SNAPFILL_ASSERT_OK((*writer)->Write("new content"));
  EXPECT_EQ(ReadAll(path), "old");
  SNAPFILL_ASSERT_OK((*writer)->Commit());
  EXPECT_EQ(ReadAll(path), "new content");
}

TEST_F(FileUtilTest, TargetCreatedDuringWriteIsNotClobbered) {
  const std::string path = Path("race.bin");
  auto writer = AtomicFileWriter::Create(path, false);
  SNAPFILL_ASSERT_OK(writer);
  SNAPFILL_ASSERT_OK((*writer)->Write("mine"));
  WriteRaw(path, "theirs");  // someone else got there first
  const absl::Status s = (*writer)->Commit();
  EXPECT_EQ(s.code(), absl::StatusCode::kAlreadyExists) << s;
  EXPECT_EQ(ReadAll(path), "theirs");
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"race.bin"});
  // The error sticks.
  EXPECT_EQ((*writer)->Write("x").code(), absl::StatusCode::kAlreadyExists);
}

TEST_F(FileUtilTest, AbandonedWriterRemovesTemporary) {
  {
    auto writer = AtomicFileWriter::Create(Path("abandoned.bin"), false);
    SNAPFILL_ASSERT_OK(writer);
    SNAPFILL_ASSERT_OK((*writer)->Write("partial"));
    EXPECT_EQ(ListDir(dir_).size(), 1u);
  }
  EXPECT_TRUE(ListDir(dir_).empty());
}

// A writer killed with SIGKILL leaves its temporary behind; the next writer
// of the same target removes it if its process is gone, and nothing else.
TEST_F(FileUtilTest, StaleTemporaryOfADeadWriterIsRemoved) {
  const pid_t child = ::fork();
  ASSERT_GE(child, 0);
  if (child == 0) ::_exit(0);
  ASSERT_EQ(::waitpid(child, nullptr, 0), child);  // its pid is now free
  const std::string dead = Path(absl::StrCat(".cache.kv.tmp.", child));
  const std::string dead_numbered = Path(absl::StrCat(".cache.kv.tmp.", child, ".3"));
  const std::string alive = Path(absl::StrCat(".cache.kv.tmp.", ::getppid()));
  const std::string other = Path(absl::StrCat(".other.kv.tmp.", child));
  for (const std::string& p : {dead, dead_numbered, alive, other}) WriteRaw(p, "partial");
  SNAPFILL_ASSERT_OK(WriteFileAtomically(Path("cache.kv"), "complete", false));
  EXPECT_FALSE(Exists(dead));
  EXPECT_FALSE(Exists(dead_numbered));
  EXPECT_TRUE(Exists(alive)) << "a live process's temporary must be left alone";
  EXPECT_TRUE(Exists(other)) << "another target's temporary must be left alone";
  EXPECT_EQ(ReadAll(Path("cache.kv")), "complete");
}

TEST_F(FileUtilTest, DirectoryTargetIsRefused) {
  ASSERT_EQ(::mkdir(Path("sub").c_str(), 0755), 0);
  for (bool overwrite : {false, true}) {
    const absl::Status s = WriteFileAtomically(Path("sub"), "x", overwrite);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr(Path("sub")));
    EXPECT_THAT(std::string(s.message()), HasSubstr("directory"));
  }
  const absl::Status slash = WriteFileAtomically(Path("sub") + "/", "x", true);
  EXPECT_FALSE(slash.ok());
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"sub"});
  EXPECT_TRUE(ListDir(Path("sub")).empty());
}

TEST_F(FileUtilTest, MissingDirectoryIsRefused) {
  const std::string path = Path("no/such/dir/out.bin");
  const absl::Status s = WriteFileAtomically(path, "x", false);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  EXPECT_TRUE(ListDir(dir_).empty());
}

TEST_F(FileUtilTest, PathThroughRegularFileIsRefused) {
  // We run as root, so permissions cannot make a directory unwritable; a
  // regular file used as a directory fails for everyone.
  WriteRaw(Path("plain"), "data");
  const std::string path = Path("plain") + "/x";
  for (bool overwrite : {false, true}) {
    const absl::Status s = WriteFileAtomically(path, "x", overwrite);
    EXPECT_FALSE(s.ok());
    EXPECT_THAT(std::string(s.message()), HasSubstr(path));
    EXPECT_THAT(std::string(s.message()), HasSubstr("Not a directory"));
  }
  EXPECT_EQ(ListDir(dir_), std::vector<std::string>{"plain"});
  EXPECT_EQ(ReadAll(Path("plain")), "data");
}

TEST_F(FileUtilTest, EmptyPathIsRefused) {
  EXPECT_EQ(WriteFileAtomically("", "x", true).code(), absl::StatusCode::kInvalidArgument);
}

TEST(FileErrnoStatusTest, DiskFullSaysSo) {
  for (int err : {ENOSPC, EDQUOT}) {
    const absl::Status s = FileErrnoStatus(err, "cannot sync", "/x/y.bin");
    EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_THAT(std::string(s.message()), HasSubstr("disk full while writing /x/y.bin: "));
  }
  const absl::Status missing = FileErrnoStatus(ENOENT, "cannot open", "/x/y.bin");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(missing.message(), "cannot open /x/y.bin: No such file or directory");
}

TEST(WriteAllTest, DevFullReportsDiskFull) {
  const int fd = ::open("/dev/full", O_WRONLY | O_CLOEXEC);
  if (fd < 0) GTEST_SKIP() << "/dev/full is not available: " << std::strerror(errno);
  const absl::Status s = WriteAll(fd, std::string(4096, 'x'), "/some/cache.kv");
  ::close(fd);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("disk full while writing /some/cache.kv"));
}

// A real full disk: a 64 KiB tmpfs. Mounting needs CAP_SYS_ADMIN; the test
// skips where that is not allowed.
class FullDiskTest : public FileUtilTest {
 protected:
  void SetUp() override {
    FileUtilTest::SetUp();
    mount_ = Path("small");
    ASSERT_EQ(::mkdir(mount_.c_str(), 0755), 0);
    if (::mount("tmpfs", mount_.c_str(), "tmpfs", 0, "size=64k") != 0) {
      GTEST_SKIP() << "cannot mount a small tmpfs here (" << std::strerror(errno)
                   << "); the /dev/full test covers the error path";
    }
    mounted_ = true;
  }
  void TearDown() override {
    if (mounted_) ::umount2(mount_.c_str(), MNT_DETACH);
    FileUtilTest::TearDown();
  }
  std::string mount_;
  bool mounted_ = false;
};

TEST_F(FullDiskTest, FullDiskLeavesNoPartialFile) {
  const std::string path = mount_ + "/cache.kv";
  const absl::Status s = WriteFileAtomically(path, std::string(1 << 20, 'x'), false);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("disk full while writing " + path));
  EXPECT_TRUE(ListDir(mount_).empty());
}

TEST_F(FullDiskTest, FullDiskKeepsOldVersion) {
  const std::string path = mount_ + "/cache.kv";
  SNAPFILL_ASSERT_OK(WriteFileAtomically(path, "old version", false));
  const absl::Status s = WriteFileAtomically(path, std::string(1 << 20, 'x'), true);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(ReadAll(path), "old version");
  EXPECT_EQ(ListDir(mount_), std::vector<std::string>{"cache.kv"});
  // Once space is there again, writing works.
  SNAPFILL_EXPECT_OK(WriteFileAtomically(path, "new version", true));
  EXPECT_EQ(ReadAll(path), "new version");
}

}  // namespace
}  // namespace snapfill
