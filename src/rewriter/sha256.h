// SHA-256 (FIPS 180-4), written here so that the generated header can name the upstream file's
// hash without linking a crypto library. Used only for fingerprints, never for security.
#pragma once

#include <string>
#include <string_view>

namespace patchgen::rewriter {

/// Lower-case hex SHA-256 of `data` (64 characters).
std::string Sha256Hex(std::string_view data);

}  // namespace patchgen::rewriter
