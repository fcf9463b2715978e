// [NOTE] The kept file of a persistent WeightArena: build it atomically, map a valid one, or
// refuse it. MoE-free: what the tensors mean is the caller's key (cache_file.h).
//
// Build:  begin_build()  creates `<dir>/<name>.ktmoe.tmp.<pid>` and reserves the
//         header page; allocations then land in 2 MiB-aligned slices from 2 MiB on.
//         commit_build() checksums each tensor's data, writes the header LAST,
//         fsyncs the file, renames it over `<name>.ktmoe` (atomic: a reader sees
//         the old file or the complete new one) and fsyncs the directory so the
//         rename survives a crash. The slices are then remapped private
//         copy-on-write at the same addresses (tensors keep their pointers; a
//         write stays in this process). abort_build() / the arena's destructor
//         unlink a temp file that was never committed.
// Reuse:  open_cached() opens `<name>.ktmoe` without following symlinks or
//         blocking, requires a regular file this user owns and others cannot
//         write, validates the header against the caller's CacheKey and the file
//         size (cache_file.h), maps each tensor MAP_PRIVATE, runs the caller's
//         content check (the ops layer: every packed expert header) and, with
//         verify_data, compares every tensor's data checksum. Nothing is written;
//         the pages are clean page cache from the first fault on. Kept files are
//         mapped PROT_READ|PROT_WRITE: a write into a tensor copies that page
//         privately (it becomes anonymous memory) and never reaches the file.
//         Truncating the file under a live mapping makes reads past the new end
//         raise SIGBUS (mmap's rule).
// Trust:  a persistent arena never follows a symlink or opens a non-regular file,
//         and refuses a directory or cache file owned by another user or writable
//         by others (unless options.trust_others); a refused directory, or
//         refuse_cache(reason), turns the arena into an unnamed-file arena: still
//         file-backed, nothing kept, every call here answers with the reason.
//         options.map_only (the cache's read-only "map" policy) creates no file
//         at all, not even an unnamed one: it maps a kept file or nothing, and
//         follows a symlink to it (it writes nothing a link could redirect; a
//         Hugging Face hub snapshot's files are links into its blobs/, confined by
//         the packed-directory loader).
// The lock that serialises validate-or-build between processes, and the order
// of these calls, are load_or_build_cache's (cache_protocol.h).
#pragma once
#include <string>
#include <vector>

#include "arena/cache_file.h"
#include "arena/weight_arena.h"
#include "common/parallel_for.h"

namespace ktmoe {

// Starts a build into a temp file: false with *error when the temp file cannot be
// made (allocations then fall back with that reason).
bool begin_build(WeightArena& arena, std::string* error);
// Writes the header for the tensors at `tensors` (key.shapes[i] bytes each,
// all in the file) with their data checksums and the key bytes, fsyncs,
// renames over the final name, fsyncs the directory. The slices become private
// copy-on-write mappings of the kept file. False with *error (temp file removed).
bool commit_build(WeightArena& arena, const CacheKey& key, const std::vector<const void*>& tensors,
                  const ParallelFor& parallel_for, std::string* error);
void abort_build(WeightArena& arena);  // removes an uncommitted temp file; no-op otherwise
// "" and *tensors set when `<dir>/<name>.ktmoe` is a trusted regular file
// holding expect.shapes, check_key accepts its key, check accepts its contents
// and, with verify_data, every tensor's data checksum matches; else why not
// ("missing", "stale: ...", "corrupt: ...", "untrusted: ...", "not a regular
// file: ..."), nothing mapped.
std::string open_cached(WeightArena& arena, const CacheKey& expect, const CacheKeyCheck& check_key,
                        const ContentCheck& check, bool verify_data, const ParallelFor& parallel_for,
                        std::vector<void*>* tensors);
// Gives up the cache for this arena (e.g. its lock path is a planted symlink):
// allocations go to an unnamed file; later calls here answer `reason`.
void refuse_cache(WeightArena& arena, const std::string& reason);

}  // namespace ktmoe
