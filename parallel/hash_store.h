// A Store inside one process (a mutex and a map), for single-process jobs and for tests
// whose ranks are threads.
#pragma once

#include <condition_variable>
#include <map>
#include <mutex>

#include "parallel/store.h"

namespace keel {

class HashStore : public Store {
 public:
  void set(const std::string& key, const std::string& value) override;
  std::string get(const std::string& key, std::chrono::milliseconds timeout) override;
  std::optional<std::string> try_get(const std::string& key) override;
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override;
  void erase(const std::vector<std::string>& keys,
             const std::vector<std::string>& prefixes) override;
  std::optional<KeyValues> try_get_prefix(const std::string& prefix) override;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::string> map_;
};

}  // namespace keel
