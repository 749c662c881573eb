// Helpers the unit-test programs share: a fresh scratch folder under the build tree, and an
// expectation on a tessera::Error's message and hint.
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>

#include "tessera/core/error.h"

namespace tessera::testing_support {

// build/Testing/tmp/<program>_<pid>_<what>, emptied and created.
inline std::filesystem::path scratch_dir(const std::string& program, const std::string& what) {
  namespace fs = std::filesystem;
  fs::path d = fs::path(TESSERA_BINARY_DIR) / "Testing" / "tmp" / (program + "_" + std::to_string(getpid()) + "_" + what);
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

// Expects `f` to throw a tessera::Error whose message or hint holds every needle.
inline void expect_error(const std::function<void()>& f, std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string what = std::string(e.what()) + " | hint: " + e.hint();
    for (const std::string& n : needles)
      EXPECT_NE(what.find(n), std::string::npos) << "error lacks '" << n << "': " << what;
  }
}

}  // namespace tessera::testing_support
