// Runs keel-worker as a real process for integration tests: a small byte-level corpus made
// once per test binary, a config writer, and a reader for the fields of --report JSON.
#pragma once

#include <map>
#include <string>
#include <vector>

namespace keel::test {

struct WorkerRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
  std::string report;  // the --report JSON ("" if none was written)
};

// A folder with train_000000.bin / val_000000.bin made from Debian's fortunes text.
const std::string& demo_data_dir();

// A config for the tiny test GPT on demo_data_dir(), one section a line, in this order:
// model (line 1), train, optim, data, parallel, runtime (line 6). `extra` adds fields to
// sections by name, e.g. {{"parallel", "dp: 2"}} (text format does not merge a repeated
// section, so extra fields must go inside it).
std::string write_config(const std::string& dir,
                         const std::map<std::string, std::string>& extra = {});

// Runs `keel-worker <args>` (with --report into `dir`) and waits for it.
WorkerRun run_worker(const std::string& dir, const std::string& args);

// Fields of a report.
std::string json_string_field(const std::string& json, const std::string& key);
double json_number_field(const std::string& json, const std::string& key);
std::vector<double> json_array_field(const std::string& json, const std::string& key);

// The tensors of an llm.c checkpoint written by --export-llmc, read raw (header + floats).
std::vector<float> read_llmc_floats(const std::string& path);

}  // namespace keel::test
