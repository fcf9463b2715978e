// [NOTE] BackingFile: the file behind a file-backed arena, RAII (closes; a
// temporary build file is also unlinked unless it was kept).
//
// Three kinds:
//   unnamed(dir)         O_TMPFILE (or create + unlink at once): vanishes with
//                        the process; slices are reserved at its end;
//   create_temp(path)    `<name>.ktmoe.tmp.<pid>`, O_CREAT|O_EXCL|O_NOFOLLOW: a
//                        cache build; keep_as(final) fsyncs, renames it over the
//                        final name and fsyncs the directory;
//   adopt(fd, size)      an opened kept cache file (read only, never written).
// reserve() grows the file with fallocate, so a full disk is an error there and
// never a SIGBUS on a later write fault. Move-only.
#pragma once
#include <cstdint>
#include <string>

namespace ktmoe {

class BackingFile {
 public:
  BackingFile() = default;
  ~BackingFile();
  BackingFile(BackingFile&& other) noexcept;
  BackingFile& operator=(BackingFile&& other) noexcept;
  BackingFile(const BackingFile&) = delete;
  BackingFile& operator=(const BackingFile&) = delete;

  // `name` only names the fallback file where O_TMPFILE is missing. Invalid + *error on failure.
  static BackingFile unnamed(const std::string& dir, const std::string& name, std::string* error);
  static BackingFile create_temp(const std::string& path, std::string* error);
  static BackingFile adopt(int fd, int64_t size);

  bool valid() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  int64_t size() const { return size_; }        // bytes reserved
  bool is_temp() const { return !temp_path_.empty(); }

  // Reserves [offset, offset + bytes) (offset >= size()); on failure the file is
  // cut back to `offset` and *error says why.
  bool reserve(int64_t offset, int64_t bytes, std::string* error);
  void resize(int64_t size);  // ftruncate: gives back a reserved tail, or grows by a hole
  // Pushes dirty pages to disk (sync_file_range); wait=false only starts it.
  bool writeback(bool wait, std::string* error);
  // Writes `bytes` at `offset`, fsyncs, renames the temp file over final_path and
  // fsyncs its directory `dir`. On failure before the rename the temp file is
  // removed. A failed directory fsync leaves the file in place (returns false).
  bool keep_as(const void* data, int64_t bytes, int64_t offset, const std::string& final_path,
               const std::string& dir, std::string* error);
  void discard_temp();  // unlinks an unkept temp file now (the fd stays open)

 private:
  int fd_ = -1;
  int64_t size_ = 0;
  std::string temp_path_;  // a temp build file not yet kept
};

}  // namespace ktmoe
