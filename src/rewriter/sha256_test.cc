#include "rewriter/sha256.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdio>
#include <string>

using patchgen::rewriter::Sha256Hex;
using patchgen::rewriter::Sha256HexOfFd;

TEST_CASE("Sha256Hex matches the FIPS 180-4 test vectors", "[rewriter]") {
  CHECK(Sha256Hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  CHECK(Sha256Hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(Sha256Hex("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq") ==
        "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
  CHECK(Sha256Hex(std::string(1000000, 'a')) ==
        "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("Sha256Hex handles lengths around the padding boundary", "[rewriter]") {
  // 55 bytes fit in one padded block, 56 need two; values from `sha256sum`.
  CHECK(Sha256Hex(std::string(55, 'a')) ==
        "9f4390f8d30c2dd92ec9f095b65e2b9ae9b0a925a5258e241c9f1e910f734318");
  CHECK(Sha256Hex(std::string(56, 'a')) ==
        "b35439a4ac6f0948b6d6f9e3c6af0f5f590ce20f1bde7090ef7970686ec6738a");
  CHECK(Sha256Hex(std::string(64, 'a')) ==
        "ffe054fe7ae0cb6dc65c3af9b61d5209f439851db43d0ba5997337df154668eb");
}

TEST_CASE("Sha256HexOfFd hashes a file read in pieces like Sha256Hex hashes its bytes",
          "[rewriter]") {
  char path[] = "/tmp/patchgen_sha256_XXXXXX";
  int fd = ::mkstemp(path);
  REQUIRE(fd >= 0);
  std::string data(3 * 1024 * 1024 + 17, 'x');  // more than one piece
  for (size_t i = 0; i < data.size(); i += 4099) data[i] = static_cast<char>(i % 251);
  REQUIRE(::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size()));
  REQUIRE(::lseek(fd, 0, SEEK_SET) == 0);
  CHECK(Sha256HexOfFd(fd) == Sha256Hex(data));
  CHECK(Sha256HexOfFd(fd) == Sha256Hex(""));  // nothing left to read
  ::close(fd);
  ::unlink(path);
  CHECK_FALSE(Sha256HexOfFd(-1).has_value());
}
