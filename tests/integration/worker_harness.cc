#include "worker_harness.h"

#include <sys/wait.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "model/token_shards.h"
#include "test_paths.h"

namespace keel::test {

const std::string& demo_data_dir() {
  static const std::string dir = [] {
    namespace fs = std::filesystem;
    std::string d = temp_dir("data");
    std::string text;
    std::vector<fs::path> files;
    const fs::path src = "/usr/share/games/fortunes";
    if (fs::exists(src))
      for (const auto& e : fs::directory_iterator(src))
        if (e.path().extension().empty() && fs::is_regular_file(fs::canonical(e.path())))
          files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      std::ifstream in(f, std::ios::binary);
      text.append(std::istreambuf_iterator<char>(in), {});
      if (text.size() > 600000) break;
    }
    if (text.size() < 100000)
      throw std::runtime_error("test corpus: install Debian's fortunes (scripts/install-deps.sh)");
    std::vector<uint16_t> tokens(text.begin(), text.end());
    for (auto& t : tokens) t &= 0xff;
    size_t split = tokens.size() * 9 / 10;
    write_token_shard(d + "/train_000000.bin", tokens.data(), split);
    write_token_shard(d + "/val_000000.bin", tokens.data() + split, tokens.size() - split);
    return d;
  }();
  return dir;
}

std::string write_config(const std::string& dir, const std::map<std::string, std::string>& extra) {
  auto more = [&](const std::string& section) {
    auto it = extra.find(section);
    return it == extra.end() ? std::string() : " " + it->second;
  };
  std::string path = dir + "/job.pbtxt";
  std::ofstream f(path);
  f << "model { plugin: \"" << bin_dir() << "/libkeel_gpt.so\" num_layers: 2 hidden_size: 32 "
    << "num_heads: 4 seq_len: 32 vocab_size: 256" << more("model") << " }\n"
    << "train { micro_batch_size: 2 global_batch_size: 8 steps: 10 seed: 1234 eval_every: 5 "
    << "eval_batches: 2" << more("train") << " }\n"
    << "optim { lr: 3e-3 warmup_steps: 2 schedule: cosine" << more("optim") << " }\n"
    << "data { train_files: \"" << demo_data_dir() << "/train_*.bin\" val_files: \""
    << demo_data_dir() << "/val_*.bin\" order: sequential" << more("data") << " }\n"
    << "parallel { comm_timeout_ms: 20000" << more("parallel") << " }\n"
    << "runtime { threads: 1" << more("runtime") << " }\n";
  return path;
}

WorkerRun run_worker(const std::string& dir, const std::string& args) {
  WorkerRun r;
  std::string report = dir + "/report.json";
  std::filesystem::remove(report);
  std::string cmd = bin_dir() + "/keel-worker --quiet --report " + report + " " + args + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) throw std::runtime_error("popen failed: " + cmd);
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) r.output.append(buf, n);
  int status = pclose(p);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  std::ifstream in(report);
  if (in) r.report.assign(std::istreambuf_iterator<char>(in), {});
  return r;
}

namespace {
size_t value_pos(const std::string& json, const std::string& key) {
  size_t k = json.find("\"" + key + "\":");
  if (k == std::string::npos) throw std::runtime_error("report has no field " + key);
  return k + key.size() + 3;
}
}  // namespace

std::string json_string_field(const std::string& json, const std::string& key) {
  size_t a = json.find('"', value_pos(json, key));
  size_t b = json.find('"', a + 1);
  return json.substr(a + 1, b - a - 1);
}

double json_number_field(const std::string& json, const std::string& key) {
  return std::stod(json.substr(value_pos(json, key)));
}

std::vector<double> json_array_field(const std::string& json, const std::string& key) {
  size_t a = json.find('[', value_pos(json, key));
  size_t b = json.find(']', a);
  std::vector<double> out;
  std::stringstream ss(json.substr(a + 1, b - a - 1));
  std::string item;
  while (std::getline(ss, item, ','))
    if (item.find_first_not_of(" \n") != std::string::npos) out.push_back(std::stod(item));
  return out;
}

std::vector<float> read_llmc_floats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  in.seekg(256 * 4);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  std::vector<float> out(bytes.size() / 4);
  std::memcpy(out.data(), bytes.data(), out.size() * 4);
  return out;
}

}  // namespace keel::test
