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
#include <string>
#include <vector>

#include "model/token_shards.h"
#include "runtime/check.h"

namespace {

namespace fs = std::filesystem;

struct Args {
  std::string out;
  double val_fraction = 0.1;
  int64_t shard_tokens = 10'000'000;
  std::string prefix;
  std::vector<std::string> files;
};

constexpr const char* kUsage =
    "usage: keel-prepare-data --out DIR [--val-fraction 0.1] [--shard-tokens 10000000]\n"
    "                         [--prefix NAME_] FILES...\n"
    "Tokenizes text files byte by byte (vocab 256) into llm.c shards:\n"
    "DIR/<prefix>train_000000.bin ... and DIR/<prefix>val_000000.bin ...\n";

[[noreturn]] void usage_error(const std::string& why) {
  std::cerr << "keel-prepare-data: " << why << "\n" << kUsage;
  std::exit(2);
}

Args parse_args(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) usage_error(arg + " needs a value");
      return argv[++i];
    };
    try {
      if (arg == "--out") {
        a.out = next();
      } else if (arg == "--val-fraction") {
        a.val_fraction = std::stod(next());
      } else if (arg == "--shard-tokens") {
        a.shard_tokens = std::stoll(next());
      } else if (arg == "--prefix") {
        a.prefix = next();
      } else if (arg == "-h" || arg == "--help") {
        std::cout << kUsage;
        std::exit(0);
      } else if (arg.size() > 1 && arg[0] == '-') {
        usage_error("unknown option " + arg);
      } else {
        a.files.push_back(arg);
      }
    } catch (const std::logic_error&) {  // stod/stoll: not a number, out of range
      usage_error(arg + " = " + argv[i] + ": not a number");
    }
  }
  if (a.out.empty()) usage_error("--out DIR is required");
  if (a.files.empty()) usage_error("no input files");
  if (!(a.val_fraction >= 0 && a.val_fraction < 1)) {
    usage_error("--val-fraction = " + std::to_string(a.val_fraction) + ": must be in [0, 1)");
  }
  // A shard needs two tokens for one (input, target) pair.
  if (a.shard_tokens < 2 || a.shard_tokens > INT32_MAX) {
    usage_error("--shard-tokens = " + std::to_string(a.shard_tokens) +
                ": must be in [2, 2147483647]");
  }
  return a;
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
  Args args = parse_args(argc, argv);
  try {
    return run(args);
  } catch (const std::exception& e) {
    std::cerr << "keel-prepare-data: " << e.what() << "\n";
    return 1;
  }
}
