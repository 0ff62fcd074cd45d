// SHA-256 (FIPS 180-4) of the bytes patchgen records: the upstream file's hash in the generated
// header, contract-pin fingerprints. Nettle computes it (sha256.cc). Used only for
// fingerprints, never for security.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace patchgen::rewriter {

/// Lower-case hex SHA-256 of `data` (64 characters).
std::string Sha256Hex(std::string_view data);

/// Lower-case hex SHA-256 of everything left to read from the open file `fd`, read in pieces (a
/// large file is never held in memory whole); nullopt when a read fails.
std::optional<std::string> Sha256HexOfFd(int fd);

}  // namespace patchgen::rewriter
