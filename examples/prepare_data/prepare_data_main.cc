// keel-prepare-data: turns text files into llm.c token shards with the byte-level tokenizer
// (vocab 256, token = byte), the tokenizer of keel's demo corpus (DESIGN.md, Data).
//
//   keel-prepare-data --out DIR [--val-fraction 0.1] [--shard-tokens 10000000]
//                     [--prefix NAME_] FILES...
//
// The files are read in order and concatenated; a file holding a NUL byte is taken for
// binary and skipped. The first 1 − f of the token stream becomes DIR/<prefix>train_*.bin,
// the last f DIR/<prefix>val_*.bin, each cut into equal shards of at most --shard-tokens.
// Every error is one line on stderr, "keel-prepare-data: error: ...", naming the flag or the
// file and what is wrong with it; exit 2 for bad input (flags, files, --out), 1 otherwise.
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
      ->transform(keel::cli::number_under(0, 1));
  // A shard needs two tokens for one (input, target) pair; its header counts them in an int32.
  app.add_option("--shard-tokens", a->shard_tokens,
                 "tokens per shard at most, in [2, 2147483647] (default 10000000)")
      ->type_name("N")
      ->transform(keel::cli::whole_number(2, INT32_MAX));
  app.add_option("--prefix", a->prefix, "put in front of every shard's name")
      ->type_name("NAME_")
      ->check(
          keel::cli::must_be([](const std::string& p) { return p.find('/') == std::string::npos; },
                             "the start of a file name, without '/' (--out names the directory)"));
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
  // No tokens (--val-fraction 0): no shard, but the stale ones below go all the same.
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

// "a.txt", "a.txt, b.txt" or "a.txt, b.txt, ... (5 files)": the files a count came from.
std::string file_list(const std::vector<std::string>& files) {
  std::string out;
  for (size_t i = 0; i < files.size() && i < 3; ++i) out += (i ? ", " : "") + files[i];
  if (files.size() > 3) out += keel::detail::concat(", ... (", files.size(), " files)");
  return out;
}

// Refuses --out before any file is read: a file where the directory should be, or a directory
// (or, when it is still to be made, its nearest existing parent) this process cannot write in.
void check_out(const std::string& out) {
  fs::path dir = fs::absolute(out);
  std::error_code ec;
  while (!fs::exists(dir, ec) && dir.has_parent_path() && dir != dir.parent_path())
    dir = dir.parent_path();
  const std::string which = dir == fs::absolute(out) ? "" : " (" + dir.string() + ")";
  if (!fs::is_directory(dir, ec))
    throw keel::InputError("--out " + out + ": " + (which.empty() ? "" : dir.string() + " ") +
                           "is a file, not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    throw keel::InputError("--out " + out + ": cannot write in it" + which + ": " +
                           std::strerror(errno));
}

// One input file's bytes; refuses a directory, a file it cannot open or read, naming it.
std::string read_input(const std::string& f) {
  std::error_code ec;
  if (fs::is_directory(f, ec)) throw keel::InputError(f + ": is a directory, not a text file");
  std::ifstream in(f, std::ios::binary);
  if (!in) throw keel::InputError(f + ": cannot open: " + std::strerror(errno));
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) throw keel::InputError(f + ": read failed: " + std::strerror(errno));
  return bytes;
}

int run(const Args& a) {
  check_out(a.out);
  std::vector<uint16_t> tokens;
  std::vector<std::string> used;
  for (const auto& f : a.files) {
    const std::string bytes = read_input(f);
    if (bytes.find('\0') != std::string::npos) {
      std::cout << "skipping " << f << " (binary: holds a NUL byte)\n";
      continue;
    }
    for (unsigned char c : bytes) tokens.push_back(c);
    used.push_back(f);
  }
  size_t n = tokens.size();
  size_t n_val = size_t(double(n) * a.val_fraction);
  size_t n_train = n - n_val;
  // Where the tokens came from, for a refusal: "a.txt, b.bin: ... in 1 text file (1 skipped as
  // binary)".
  const size_t skipped = a.files.size() - used.size();
  const std::string from = keel::detail::concat(
      " in ", used.size(), " text file(s)",
      skipped ? keel::detail::concat(" (", skipped, " skipped as binary)") : std::string());
  if (n_train < 2) {
    throw keel::InputError(keel::detail::concat(file_list(a.files), ": only ", n_train,
                                                " training token(s)", from,
                                                "; need at least 2 (a token is a byte)"));
  }
  if (a.val_fraction > 0 && n_val < 2) {
    throw keel::InputError(
        keel::detail::concat(file_list(a.files), ": only ", n_val,
                             " validation token(s) (--val-fraction ", a.val_fraction, " of ", n,
                             from, "); need at least 2: give more text, or --val-fraction 0"));
  }
  std::error_code ec;
  fs::create_directories(a.out, ec);
  if (ec) throw keel::InputError("--out " + a.out + ": cannot make the directory: " + ec.message());
  int train_shards = write_split(a, "train", tokens, 0, n_train);
  int val_shards = write_split(a, "val", tokens, n_train, n);
  std::cout << "keel-prepare-data: " << used.size() << " file(s), " << n << " tokens: " << n_train
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
  } catch (const keel::InputError& e) {
    std::cerr << "keel-prepare-data: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "keel-prepare-data: error: " << e.what() << "\n";
    return 1;
  }
}
