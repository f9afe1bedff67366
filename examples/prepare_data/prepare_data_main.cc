// keel-prepare-data: turns text files into llm.c token shards with the byte-level tokenizer
// (vocab 256, token = byte), the tokenizer of keel's demo corpus (DESIGN.md, Data).
//
//   keel-prepare-data --out DIR [--val-fraction 0.1] [--shard-tokens 10000000]
//                     [--prefix NAME_] FILES...
//
// The files are read in order and concatenated; a file holding a NUL byte is taken for
// binary and skipped. The first 1 − f of the token stream becomes DIR/<prefix>train_*.bin,
// the last f DIR/<prefix>val_*.bin, each cut into equal shards of at most --shard-tokens.
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "model/token_shards.h"
#include "runtime/check.h"
#include "runtime/cli.h"
#include "runtime/logging.h"

namespace {

namespace fs = std::filesystem;

struct Args {
  std::string out;
  double val_fraction = 0.1;
  int64_t shard_tokens = 10'000'000;
  std::string prefix;
  std::vector<std::string> files;
};

// Fills *a from argv. Returns nothing to go on, or the exit status to end with (0 after
// --help; 2 after a usage error, reported as "keel-prepare-data: error: ...").
std::optional<int> parse_args(int argc, char** argv, Args* a) {
  CLI::App app(
      "keel-prepare-data: tokenizes text files byte by byte (vocab 256) into llm.c shards: "
      "DIR/<prefix>train_000000.bin ... and DIR/<prefix>val_000000.bin ...",
      "keel-prepare-data");
  app.add_option("--out", a->out, "where the shards go (made if missing)")
      ->type_name("DIR")
      ->required();
  app.add_option("--val-fraction", a->val_fraction,
                 "the last fraction of the tokens, in [0, 1), becomes the val split (default 0.1)")
      ->type_name("F")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            char* end = nullptr;
            const double f = std::strtod(text.c_str(), &end);
            return end != text.c_str() && *end == '\0' && f >= 0 && f < 1
                       ? ""
                       : text + ": must be in [0, 1)";
          },
          ""));
  // A shard needs two tokens for one (input, target) pair.
  app.add_option("--shard-tokens", a->shard_tokens,
                 "tokens per shard at most, in [2, 2147483647] (default 10000000)")
      ->type_name("N")
      ->check(CLI::Range(int64_t{2}, int64_t{INT32_MAX}).description(""));
  app.add_option("--prefix", a->prefix, "put in front of every shard's name")->type_name("NAME_");
  app.add_option("FILES", a->files,
                 "the text files, read in order and concatenated; one holding a NUL byte is "
                 "taken for binary and skipped")
      ->type_name("")
      ->required();
  return keel::cli::parse(app, argc, argv);
}

// Writes tokens[begin, end) as equal shards of at most shard_tokens; returns how many.
// Equal cuts keep the last shard from being a sliver too small for one batch.
int write_split(const Args& a, const std::string& split, const std::vector<uint16_t>& tokens,
                size_t begin, size_t end) {
  size_t n = end - begin;
  if (n == 0) return 0;
  size_t shards = (n + size_t(a.shard_tokens) - 1) / size_t(a.shard_tokens);
  for (size_t s = 0; s < shards; ++s) {
    size_t lo = begin + n * s / shards, hi = begin + n * (s + 1) / shards;
    char name[32];
    std::snprintf(name, sizeof(name), "%s_%06zu.bin", split.c_str(), s);
    fs::path path = fs::path(a.out) / (a.prefix + name);
    keel::write_token_shard(path.string(), tokens.data() + lo, hi - lo);
    std::cout << "wrote " << path.string() << " (" << hi - lo << " tokens)\n";
  }
  // Shards left by an earlier, larger run would join this split through the glob.
  for (size_t s = shards;; ++s) {
    char name[32];
    std::snprintf(name, sizeof(name), "%s_%06zu.bin", split.c_str(), s);
    fs::path stale = fs::path(a.out) / (a.prefix + name);
    if (!fs::exists(stale)) break;
    fs::remove(stale);
    std::cout << "removed stale " << stale.string() << "\n";
  }
  return int(shards);
}

int run(const Args& a) {
  std::vector<uint16_t> tokens;
  int used = 0;
  for (const auto& f : a.files) {
    std::ifstream in(f, std::ios::binary);
    if (!in) throw keel::InputError(f + ": cannot open");
    std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (in.bad()) throw keel::InputError(f + ": read failed");
    if (bytes.find('\0') != std::string::npos) {
      std::cout << "skipping " << f << " (binary: holds a NUL byte)\n";
      continue;
    }
    for (unsigned char c : bytes) tokens.push_back(c);
    ++used;
  }
  size_t n = tokens.size();
  size_t n_val = size_t(double(n) * a.val_fraction);
  size_t n_train = n - n_val;
  if (n_train < 2) {
    throw keel::InputError(keel::detail::concat("only ", n_train, " training tokens from ", used,
                                                " text file(s); need at least 2"));
  }
  if (a.val_fraction > 0 && n_val < 2) {
    throw keel::InputError(keel::detail::concat("only ", n_val, " validation tokens (",
                                                "--val-fraction ", a.val_fraction, " of ", n,
                                                "); need at least 2"));
  }
  fs::create_directories(a.out);
  int train_shards = write_split(a, "train", tokens, 0, n_train);
  int val_shards = write_split(a, "val", tokens, n_train, n);
  std::cout << "keel-prepare-data: " << used << " file(s), " << n << " tokens: " << n_train
            << " train in " << train_shards << " shard(s), " << n_val << " val in " << val_shards
            << " shard(s), vocab 256 (byte-level)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  keel::init_logging(argv[0]);
  Args args;
  if (auto rc = parse_args(argc, argv, &args)) return *rc;
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << "keel-prepare-data: " << e.what() << "\n";
    return 1;
  }
}
