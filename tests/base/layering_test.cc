// The layers' rule, checked on the source tree: data flows one way, from
// tools/ through the engine to the model, pruners and schedules, to the
// backend, to the kernels; a file may include headers of its own layer and
// of the layers below it, never above, and product code never includes the
// test-only scalar twins (kernels/ref). Every include is resolved as the
// compiler would (quoted from the includer's folder first, then the include
// roots; `..` and doubled slashes collapse; a macro include is followed to
// its #define; a bare file name found nowhere else matches the one project
// header of that name), so no spelling hides an edge.
//
// The build enforces the same rule for ordinary spellings (each library
// sees only the include roots of the layers it links; the layering_build_*
// tests); this check also catches the spellings a compiler resolves from
// the includer's folder.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace snapfill {
namespace {

namespace fs = std::filesystem;

struct Layer {
  const char* name;
  std::vector<const char*> prefixes;  // paths from the root; the longest match wins
  std::vector<const char*> below;     // layers it may include (their own `below` too)
  bool product = true;
  // A layer others reach only through this one (the kernels through the
  // backend): no other product layer may include it, even from above.
  const char* only_through = nullptr;
};

// The layer picture of docs/DESIGN.md §13, bottom up.
const std::vector<Layer>& Layers() {
  static const std::vector<Layer> kLayers = {
      {"base", {"src/base/", "include/snapfill/status.h", "include/snapfill/dtype.h", "include/snapfill/token_source.h"}, {}},
      {"kernels", {"kernels/"}, {"base"}, /*product=*/true, /*only_through=*/"backend"},
      {"kernels_ref", {"kernels/ref/"}, {"kernels"}, /*product=*/false},
      {"gguf", {"src/gguf/"}, {"base"}},
      {"schedules", {"schedules/", "include/snapfill/schedule.h"}, {"base"}},
      {"backend", {"src/backend/", "include/snapfill/backend.h"}, {"kernels"}},
      {"tokenizer", {"src/tokenizer/"}, {"gguf"}},
      {"kv", {"src/kv/", "include/snapfill/recall_format.h"}, {"backend"}},
      {"model", {"src/model/"}, {"kv", "gguf"}},
      {"compress", {"src/compress/", "include/snapfill/pruner_config.h"}, {"kv"}},
      {"engine", {"src/engine/", "include/snapfill/engine.h"}, {"model", "compress", "schedules", "tokenizer"}},
      {"tools", {"tools/"}, {"engine"}},
      // The test models: GGUF files written with the scalar twins' quantizers.
      {"testmodel", {"tools/testmodel/", "tools/make_tiny_gguf_main.cc"}, {"gguf", "kernels_ref"},
       /*product=*/false},
      {"tests", {"tests/", "bench/"}, {"tools", "testmodel", "kernels_ref"}, /*product=*/false},
  };
  return kLayers;
}

const Layer* LayerOf(const std::string& rel) {
  const Layer* best = nullptr;
  size_t best_len = 0;
  for (const Layer& l : Layers()) {
    for (const char* p : l.prefixes) {
      const std::string prefix(p);
      if (rel.compare(0, prefix.size(), prefix) == 0 && prefix.size() > best_len) {
        best = &l;
        best_len = prefix.size();
      }
    }
  }
  return best;
}

// Whether layer `from` may include a header of layer `to`.
bool Allowed(const Layer& from, const Layer& to) {
  if (&from == &to) return true;
  if (from.product && !to.product) return false;
  if (from.product && to.only_through != nullptr && std::string(from.name) != to.only_through) return false;
  std::set<std::string> seen;
  std::vector<std::string> todo(from.below.begin(), from.below.end());
  while (!todo.empty()) {
    const std::string name = todo.back();
    todo.pop_back();
    if (name == to.name) return true;
    if (!seen.insert(name).second) continue;
    for (const Layer& l : Layers()) {
      if (name == l.name) todo.insert(todo.end(), l.below.begin(), l.below.end());
    }
  }
  return false;
}

struct Include {
  int line = 0;
  std::string spelling;  // the path, or the macro's name
  bool angle = false;
  bool macro = false;
};

// The include directives of a source text: backslash-newlines spliced,
// comments, string and character literals (raw ones too) skipped outside
// the directive itself. Every branch of a conditional counts.
std::vector<Include> ScanIncludes(const std::string& text) {
  // Splice, remembering each spliced line's first physical line.
  std::vector<std::pair<std::string, int>> lines;
  {
    std::string cur;
    int line = 1, first = 1;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '\\' && i + 1 < text.size() && text[i + 1] == '\n') {
        ++i;
        ++line;
        continue;
      }
      if (text[i] == '\n') {
        lines.emplace_back(cur, first);
        cur.clear();
        first = ++line;
        continue;
      }
      cur += text[i];
    }
    lines.emplace_back(cur, first);
  }
  static const std::regex kDirective(R"re(^\s*#\s*include(_next)?\s*(<([^>]*)>|"([^"]*)"|([A-Za-z_]\w*)))re");
  std::vector<Include> out;
  bool in_block = false;       // inside /* */
  std::string raw_end;         // inside a raw string: its closing ")delim\""
  for (const auto& [line, number] : lines) {
    // The line with comments blanked and literals emptied, unless it is a
    // directive, whose quoted path must stay.
    std::string code;
    for (size_t i = 0; i < line.size();) {
      if (!raw_end.empty()) {
        const size_t end = line.find(raw_end, i);
        if (end == std::string::npos) {
          i = line.size();
          break;
        }
        i = end + raw_end.size();
        raw_end.clear();
        code += "\"\"";
        continue;
      }
      if (in_block) {
        const size_t end = line.find("*/", i);
        if (end == std::string::npos) {
          i = line.size();
          break;
        }
        i = end + 2;
        in_block = false;
        code += ' ';
        continue;
      }
      const char c = line[i];
      if (c == '/' && i + 1 < line.size() && line[i + 1] == '/') break;
      if (c == '/' && i + 1 < line.size() && line[i + 1] == '*') {
        in_block = true;
        i += 2;
        continue;
      }
      if (c == 'R' && i + 1 < line.size() && line[i + 1] == '"' &&
          (i == 0 || !(std::isalnum(static_cast<unsigned char>(line[i - 1])) || line[i - 1] == '_'))) {
        const size_t open = line.find('(', i + 2);
        if (open != std::string::npos) {
          raw_end = ")" + line.substr(i + 2, open - i - 2) + "\"";
          i = open + 1;
          continue;
        }
      }
      if (c == '"' || c == '\'') {
        // Keep the literal's text on a directive line (the quoted path);
        // the regex below only reads it there.
        size_t j = i + 1;
        while (j < line.size() && line[j] != c) j += line[j] == '\\' ? 2 : 1;
        code += line.substr(i, std::min(j + 1, line.size()) - i);
        i = j + 1;
        continue;
      }
      code += c;
      ++i;
    }
    std::smatch m;
    if (!std::regex_search(code, m, kDirective)) continue;
    Include inc;
    inc.line = number;
    if (m[3].matched) {
      inc.spelling = m[3];
      inc.angle = true;
    } else if (m[4].matched) {
      inc.spelling = m[4];
    } else {
      inc.spelling = m[5];
      inc.macro = true;
    }
    out.push_back(inc);
  }
  return out;
}

bool IsSource(const fs::path& p) {
  const std::string e = p.extension().string();
  return e == ".cc" || e == ".h" || e == ".inc" || e == ".cu" || e == ".cuh" || e == ".cpp";
}

struct Violation {
  std::string file, header;
  int line;
  std::string text;
};

// Every wrong-way include under `root`'s product and test folders.
std::vector<Violation> CheckTree(const fs::path& root) {
  std::vector<fs::path> files;
  for (const char* top : {"src", "include", "kernels", "schedules", "tools", "tests", "bench"}) {
    if (!fs::exists(root / top)) continue;
    for (const auto& e : fs::recursive_directory_iterator(root / top)) {
      if (e.is_regular_file() && IsSource(e.path())) files.push_back(fs::weakly_canonical(e.path()));
    }
  }
  const fs::path canon_root = fs::weakly_canonical(root);
  auto rel = [&](const fs::path& p) { return fs::relative(p, canon_root).generic_string(); };
  // Project headers by file name (a bare name found nowhere else), and
  // macros that name a header ("#define NAME "path"").
  std::map<std::string, std::vector<fs::path>> by_name;
  for (const fs::path& f : files) by_name[f.filename().string()].push_back(f);
  std::map<std::string, std::string> macros;
  std::map<fs::path, std::vector<Include>> includes;
  static const std::regex kDefine(R"re(^\s*#\s*define\s+([A-Za-z_]\w*)\s+[<"]([^>"]+)[>"])re");
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    includes[f] = ScanIncludes(text);
    std::istringstream lines(text);
    for (std::string l; std::getline(lines, l);) {
      std::smatch m;
      if (std::regex_search(l, m, kDefine)) macros[m[1]] = m[2];
    }
  }
  const std::vector<fs::path> roots = {canon_root, canon_root / "include"};
  std::vector<Violation> out;
  for (const auto& [file, incs] : includes) {
    const Layer* from = LayerOf(rel(file));
    if (from == nullptr) continue;
    for (const Include& inc : incs) {
      std::string spelling = inc.spelling;
      if (inc.macro) {
        const auto it = macros.find(spelling);
        if (it == macros.end()) {
          out.push_back({rel(file), "", inc.line, "#include " + spelling + ": macro not defined in the tree"});
          continue;
        }
        spelling = it->second;
      }
      std::optional<fs::path> target;
      std::vector<fs::path> dirs;
      if (!inc.angle) dirs.push_back(file.parent_path());
      dirs.insert(dirs.end(), roots.begin(), roots.end());
      for (const fs::path& d : dirs) {
        const fs::path p = fs::weakly_canonical(d / spelling);
        if (fs::is_regular_file(p)) {
          target = p;
          break;
        }
      }
      if (!target && spelling.find('/') == std::string::npos) {
        const auto it = by_name.find(spelling);
        if (it != by_name.end() && it->second.size() == 1) target = it->second[0];
      }
      if (!target) continue;  // a system or third-party header
      const std::string to_rel = rel(*target);
      if (to_rel.rfind("..", 0) == 0) continue;  // outside the tree
      const Layer* to = LayerOf(to_rel);
      if (to == nullptr || Allowed(*from, *to)) continue;
      out.push_back({rel(file), to_rel, inc.line,
                     std::string(from->name) + " includes " + to->name + " (\"" + inc.spelling + "\")"});
    }
  }
  return out;
}

fs::path SourceRoot() { return fs::path(SNAPFILL_SOURCE_DIR); }

TEST(LayeringTest, NoLayerIncludesAHigherOne) {
  for (const Violation& v : CheckTree(SourceRoot())) {
    ADD_FAILURE() << v.file << ":" << v.line << ": " << v.text << " -> " << v.header;
  }
}

class PlantedTreeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() /
            ("snapfill_layering_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) + "_" +
             ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    Write("src/engine/e.h", "#pragma once\n");
    Write("src/kv/ok.h", "#pragma once\n");
    Write("kernels/ref/r.h", "#pragma once\n");
  }
  void TearDown() override { fs::remove_all(root_); }
  void Write(const std::string& rel, const std::string& text) {
    fs::create_directories((root_ / rel).parent_path());
    std::ofstream(root_ / rel) << text;
  }
  // The violations of a one-file tree src/kv/a.cc with `text`.
  std::vector<Violation> Check(const std::string& text) {
    Write("src/kv/a.cc", text);
    return CheckTree(root_);
  }
  fs::path root_;
};

TEST_F(PlantedTreeTest, EverySpellingOfAnUpwardIncludeIsCaught) {
  const std::vector<std::string> spellings = {
      "#include \"src/engine/e.h\"\n",
      "#include <src/engine/e.h>\n",
      "#include \"../engine/e.h\"\n",
      "#include \"./../engine/e.h\"\n",
      "#include \"src/kv/../engine/e.h\"\n",
      "#include \"src//engine/e.h\"\n",
      "  #  include   \"src/engine/e.h\"\n",
      "#include/**/\"src/engine/e.h\"\n",
      "#inc\\\nlude \"src/engine/e.h\"\n",
      "#define WHERE \"src/engine/e.h\"\n#include WHERE\n",
      "#if 0\n#include \"src/engine/e.h\"\n#endif\n",
      "#include \"e.h\"\n",  // a bare name: the one project header of that name
      "/* a comment */ #include \"src/engine/e.h\"\n",
  };
  for (const std::string& s : spellings) {
    const std::vector<Violation> v = Check(s);
    ASSERT_EQ(v.size(), 1u) << s;
    EXPECT_EQ(v[0].header, "src/engine/e.h") << s;
    EXPECT_EQ(v[0].file, "src/kv/a.cc") << s;
  }
}

TEST_F(PlantedTreeTest, CommentsAndStringsAreNotIncludes) {
  for (const char* s : {"// #include \"src/engine/e.h\"\n", "/* #include \"src/engine/e.h\" */\n",
                               "/*\n#include \"src/engine/e.h\"\n*/\n",
                               "const char* s = R\"(\n#include \"src/engine/e.h\"\n)\";\n",
                               "#include \"src/kv/ok.h\"\n#include <vector>\n"}) {
    EXPECT_THAT(Check(s), ::testing::IsEmpty()) << s;
  }
}

TEST_F(PlantedTreeTest, ProductNeverIncludesTheScalarTwins) {
  const std::vector<Violation> v = Check("#include \"kernels/ref/r.h\"\n");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].header, "kernels/ref/r.h");
  Write("tests/t_test.cc", "#include \"kernels/ref/r.h\"\n#include \"src/engine/e.h\"\n");
  fs::remove(root_ / "src/kv/a.cc");
  EXPECT_THAT(CheckTree(root_), ::testing::IsEmpty()) << "tests may include anything";
}

TEST_F(PlantedTreeTest, OnlyTheBackendReachesTheKernels) {
  Write("kernels/cpu/k.h", "#pragma once\n");
  Write("src/backend/b.cc", "#include \"kernels/cpu/k.h\"\n");
  const std::vector<Violation> v = Check("#include \"kernels/cpu/k.h\"\n");
  ASSERT_EQ(v.size(), 1u) << "kv skips the backend";
  EXPECT_EQ(v[0].file, "src/kv/a.cc");
}

TEST_F(PlantedTreeTest, AnUndefinedMacroIncludeFails) {
  const std::vector<Violation> v = Check("#include NOWHERE\n");
  ASSERT_EQ(v.size(), 1u);
  EXPECT_THAT(v[0].text, ::testing::HasSubstr("macro not defined"));
}

}  // namespace
}  // namespace snapfill
