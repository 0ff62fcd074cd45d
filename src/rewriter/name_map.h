// name_map renaming (spec- and patch-level entries of a spec) with use tracking: each stage
// renames through its own NameMap and returns the keys it used; a key no stage used is an error
// (generate.cc reports it).
#pragma once

#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "base/diagnostic.h"
#include "spec/patch_spec.h"

namespace patchgen::rewriter {

/// A name_map (spec- or patch-level) and which of its entries renamed something.
class NameMap {
 public:
  explicit NameMap(const std::vector<spec::NameMapEntry>& entries);

  /// The new name of identifier `name` (marking the entry used), or nullopt. A whole-name key
  /// wins over prefix rules, a longer prefix over a shorter one; when a rule's new prefix extends
  /// the old one, an identifier that already starts with the new prefix is left alone.
  std::optional<std::string> Map(std::string_view name);

  /// `A.B.m` with every dotted component mapped (spec-level name_map on targets).
  std::string MapDotted(const std::string& dotted);

  /// Keys (NameMapEntry::Key()) of the entries used so far.
  std::set<std::string> UsedKeys() const;

  /// "name_map key 'X' is never used" for each entry not used and not in `used_elsewhere`.
  void ReportUnused(const std::set<std::string>& used_elsewhere,
                    std::vector<Diagnostic>& errors) const;

 private:
  struct Use {
    const spec::NameMapEntry* entry;
    bool used;
    std::string keyword_from = {};  ///< The first name a prefix rule would turn into a keyword.
  };
  std::vector<Use> uses_;
};

}  // namespace patchgen::rewriter
