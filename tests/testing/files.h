// Small file helpers shared by the tests.
#ifndef SNAPFILL_TESTS_TESTING_FILES_H_
#define SNAPFILL_TESTS_TESTING_FILES_H_

#include <cstdint>
#include <string>
#include <vector>

namespace snapfill::testing {

// The whole file as bytes ("" if it cannot be read).
std::string ReadAll(const std::string& path);
// Replaces the file with `data`.
void WriteRaw(const std::string& path, const std::string& data);
// A new empty folder under gtest's TempDir(), named after `stem`; removed
// with what it holds when the test binary exits (SNAPFILL_KEEP_TEST_FILES=1
// keeps it).
std::string MakeTempDir(const std::string& stem);
// Names in `dir`, without "." and "..", sorted.
std::vector<std::string> ListDir(const std::string& dir);
// Bytes of the pages of [data, data + bytes) that this process has mapped
// now (/proc/self/pagemap's present bit), whole pages counted.
uint64_t MappedResidentBytes(const void* data, uint64_t bytes);

}  // namespace snapfill::testing

#endif  // SNAPFILL_TESTS_TESTING_FILES_H_
