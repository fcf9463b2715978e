// [NOTE] Inspection of one kept cache file: what `python -m torch_ktmoe inspect`
// lists. Torch-free and MoE-free, like the rest of arena/.
//
// The file is opened as a load opens it (open_regular_file: no symlink followed,
// no wait on a FIFO), its header read and checked (check_cache_header). The
// owner of the key bytes (for packed experts: ops/packed_cache.h) then decodes
// the stored key into the checks a load of that key runs (CacheLoadChecks); the
// file is mapped and checked exactly as that load would do it, in a throwaway
// persistent arena that accepts files of other users (inspect reports a file,
// it never refuses to look). Residency: mincore over a read-only map.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "arena/cache_file.h"
#include "arena/weight_arena.h"
#include "common/parallel_for.h"

namespace ktmoe {

// What a load of one key expects of a file and how it judges it (open_cached's arguments, kept_file.h).
struct CacheLoadChecks {
  CacheKey expect;
  CacheKeyCheck check_key;
  ContentCheck check_content;
};

// Decodes the key bytes stored in a file: "" and *checks set, or why the key is
// not usable ("stale: ...", "corrupt: ...").
using CacheKeyReader = std::function<std::string(const std::string& stored_key, CacheLoadChecks* checks)>;

struct CacheFileInspection {
  int64_t file_bytes = 0;       // size on disk (0 when the file cannot be opened)
  int64_t resident_bytes = -1;  // bytes of the file in the page cache; -1 when unknown
  bool header_ok = false;       // the header is well formed: shapes and stored_key are the file's
  std::vector<std::pair<int64_t, int64_t>> shapes;  // [rows, cols] (uint8) of each tensor
  std::string stored_key;       // opaque key bytes
  std::string reason;           // "" when the file is valid as its key describes it, else why not
};

// The header, validity (the checks of a load of the file's own key, as
// read_key decodes it; verify_data: data checksums too) and residency of the
// cache file at `path`. Never throws for a bad file: the reason says what is wrong.
CacheFileInspection inspect_cache_file(const std::string& path, bool verify_data, const CacheKeyReader& read_key,
                                       const ParallelFor& parallel_for);

}  // namespace ktmoe
