#include "launcher/stack_unwinder.h"

#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <libunwind-ptrace.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <utility>

#include "runtime/check.h"

// libunwind's own search of an .eh_frame_hdr table, which its ptrace accessors use too; not
// in its public headers. x86-64 is the only architecture keel builds for.
extern "C" int _Ux86_64_dwarf_search_unwind_table(unw_addr_space_t as, unw_word_t ip,
                                                  unw_dyn_info_t* di, unw_proc_info_t* pi,
                                                  int need_unwind_info, void* arg);

namespace keel {
namespace {

// DWARF pointer encodings of an .eh_frame_hdr (the LSB's names).
constexpr uint8_t DW_EH_PE_udata4 = 0x03, DW_EH_PE_sdata4 = 0x0b, DW_EH_PE_datarel = 0x30;

// Deeper stacks are cut: the frames that tell where a thread is are the innermost ones.
constexpr int kMaxFrames = 64;

struct Mapping {
  uint64_t start = 0, end = 0, offset = 0;
  std::string path;    // "" for anonymous memory
  std::string module;  // the file's base name, "[vdso]", or "[anon]"
  bool deleted = false;
};

// The executable mappings of `pid`, to name the module of a frame and its offset in the file
// (stable across processes, unlike the address, which ASLR moves).
std::vector<Mapping> read_maps(pid_t pid) {
  std::vector<Mapping> out;
  std::ifstream in("/proc/" + std::to_string(pid) + "/maps");
  std::string line;
  while (std::getline(in, line)) {
    unsigned long long start = 0, end = 0, offset = 0;
    char perms[8] = {0};
    int path_at = 0;
    if (std::sscanf(line.c_str(), "%llx-%llx %7s %llx %*s %*s %n", &start, &end, perms, &offset,
                    &path_at) < 4)
      continue;
    Mapping m{start, end, offset, path_at > 0 ? line.substr(size_t(path_at)) : "", "", false};
    // A file replaced since it was mapped: the same module, to be read another way.
    const std::string deleted = " (deleted)";
    if (m.path.size() > deleted.size() &&
        m.path.compare(m.path.size() - deleted.size(), deleted.size(), deleted) == 0) {
      m.path.resize(m.path.size() - deleted.size());
      m.deleted = true;
    }
    m.module = m.path.empty() ? "[anon]" : m.path.substr(m.path.rfind('/') + 1);
    if (perms[2] == 'x' || m.offset == 0) out.push_back(std::move(m));  // code, ELF headers
  }
  return out;
}

std::string demangle(const char* name) {
  int status = 0;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  return out;
}

struct Symbol {
  uint64_t start = 0, size = 0;
  std::string name;
};

// What a replaced module needs: where its unwind table is in the process's memory, and its
// function symbols (by link-time address).
struct Image {
  bool loaded = false;
  uint64_t bias = 0;  // run-time address - link-time address
  uint64_t text_start = 0, text_end = 0;
  uint64_t eh_frame_hdr = 0, fde_count = 0;  // eh_frame_hdr == 0: no table found
  std::vector<Symbol> symbols;               // by start
};

}  // namespace

struct StackUnwinder::Impl {
  pid_t pid = 0;
  std::vector<Mapping> maps;
  unw_addr_space_t as = nullptr;
  int mem_fd = -1;
  std::map<std::pair<unw_word_t, bool>, std::string> names;  // (ip, innermost) -> frame
  std::map<std::string, Image> images;                       // replaced modules, by path

  const Mapping* find(uint64_t addr) const {
    for (const Mapping& m : maps)
      if (addr >= m.start && addr < m.end) return &m;
    return nullptr;
  }

  bool read_mem(uint64_t addr, void* out, size_t n) {
    if (mem_fd < 0)
      mem_fd = ::open(("/proc/" + std::to_string(pid) + "/mem").c_str(), O_RDONLY | O_CLOEXEC);
    return mem_fd >= 0 && ::pread(mem_fd, out, n, off_t(addr)) == ssize_t(n);
  }

  Image& image_of(const Mapping& m) {
    Image& im = images[m.path];
    if (im.loaded) return im;
    im.loaded = true;
    // The ELF and program headers, as loaded: the mapping of the file's first page.
    uint64_t base = 0;
    for (const Mapping& x : maps)
      if (x.path == m.path && x.offset == 0) base = x.start;
    Elf64_Ehdr eh;
    if (!base || !read_mem(base, &eh, sizeof(eh)) ||
        std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0 || eh.e_ident[EI_CLASS] != ELFCLASS64 ||
        eh.e_phentsize != sizeof(Elf64_Phdr) || eh.e_phnum > 256)
      return im;
    std::vector<Elf64_Phdr> ph(eh.e_phnum);
    if (!read_mem(base + eh.e_phoff, ph.data(), ph.size() * sizeof(Elf64_Phdr))) return im;
    bool have_bias = false;
    for (const auto& p : ph)
      if (p.p_type == PT_LOAD && p.p_offset == 0 && !have_bias) {
        im.bias = base - p.p_vaddr;
        have_bias = true;
      }
    if (!have_bias) return im;
    for (const auto& p : ph) {
      if (p.p_type == PT_LOAD && (p.p_flags & PF_X)) {
        const uint64_t s = im.bias + p.p_vaddr, e = s + p.p_memsz;
        im.text_start = im.text_start ? std::min(im.text_start, s) : s;
        im.text_end = std::max(im.text_end, e);
      }
      if (p.p_type == PT_GNU_EH_FRAME) {
        // version 1; eh_frame_ptr 4 bytes; fde_count udata4; table of (sdata4, sdata4)
        // relative to the header: what compilers emit, and what libunwind searches.
        uint8_t hdr[12];
        const uint64_t at = im.bias + p.p_vaddr;
        if (read_mem(at, hdr, sizeof(hdr)) && hdr[0] == 1 && (hdr[1] & 0x07) == 0x03 &&
            hdr[2] == DW_EH_PE_udata4 && hdr[3] == (DW_EH_PE_datarel | DW_EH_PE_sdata4)) {
          uint32_t count = 0;
          std::memcpy(&count, hdr + 8, sizeof(count));
          im.eh_frame_hdr = at;
          im.fde_count = count;
        }
      }
    }
    read_symbols(m, &im);
    return im;
  }

  // The function symbols of the file behind `m`, read through /proc/PID/map_files: the file
  // the process mapped, whatever now has its name.
  void read_symbols(const Mapping& m, Image* im) {
    char path[96];
    std::snprintf(path, sizeof(path), "/proc/%d/map_files/%" PRIx64 "-%" PRIx64, int(pid), m.start,
                  m.end);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    struct stat st {};
    void* data = MAP_FAILED;
    if (::fstat(fd, &st) == 0 && size_t(st.st_size) >= sizeof(Elf64_Ehdr))
      data = ::mmap(nullptr, size_t(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
    ::close(fd);
    if (data == MAP_FAILED) return;
    const auto* bytes = static_cast<const uint8_t*>(data);
    const size_t size = size_t(st.st_size);
    auto fits = [size](uint64_t off, uint64_t len) { return off <= size && len <= size - off; };
    const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(bytes);
    if (eh->e_shentsize == sizeof(Elf64_Shdr) &&
        fits(eh->e_shoff, uint64_t(eh->e_shnum) * sizeof(Elf64_Shdr))) {
      const auto* sh = reinterpret_cast<const Elf64_Shdr*>(bytes + eh->e_shoff);
      // The full table if the file has one, else the dynamic symbols.
      for (uint32_t want : {uint32_t(SHT_SYMTAB), uint32_t(SHT_DYNSYM)}) {
        for (int i = 0; i < eh->e_shnum && im->symbols.empty(); ++i) {
          if (sh[i].sh_type != want || sh[i].sh_link >= eh->e_shnum ||
              sh[i].sh_entsize != sizeof(Elf64_Sym) || !fits(sh[i].sh_offset, sh[i].sh_size))
            continue;
          const Elf64_Shdr& strtab = sh[sh[i].sh_link];
          if (!fits(strtab.sh_offset, strtab.sh_size)) continue;
          const auto* syms = reinterpret_cast<const Elf64_Sym*>(bytes + sh[i].sh_offset);
          const char* strs = reinterpret_cast<const char*>(bytes + strtab.sh_offset);
          for (size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
            const Elf64_Sym& s = syms[k];
            const int type = ELF64_ST_TYPE(s.st_info);
            if ((type != STT_FUNC && type != STT_GNU_IFUNC) || s.st_shndx == SHN_UNDEF ||
                s.st_size == 0 || s.st_name >= strtab.sh_size)
              continue;
            const char* name = strs + s.st_name;
            im->symbols.push_back({s.st_value, s.st_size,
                                   std::string(name, strnlen(name, strtab.sh_size - s.st_name))});
          }
        }
        if (!im->symbols.empty()) break;
      }
    }
    ::munmap(data, size);
    std::sort(im->symbols.begin(), im->symbols.end(),
              [](const Symbol& a, const Symbol& b) { return a.start < b.start; });
  }

  std::string frame_text(unw_cursor_t& c, unw_word_t ip, bool innermost);
};

namespace {

// The unwinder whose capture runs on this thread: libunwind's callbacks get the ptrace
// accessors' argument, not ours.
thread_local StackUnwinder::Impl* t_current = nullptr;

int find_proc_info(unw_addr_space_t as, unw_word_t ip, unw_proc_info_t* pi, int need_unwind_info,
                   void* arg) {
  if (StackUnwinder::Impl* u = t_current)
    if (const Mapping* m = u->find(ip); m && m->deleted) {
      const Image& im = u->image_of(*m);
      if (!im.eh_frame_hdr || ip < im.text_start || ip >= im.text_end) return -UNW_ENOINFO;
      unw_dyn_info_t di;
      std::memset(&di, 0, sizeof(di));
      di.start_ip = im.text_start;
      di.end_ip = im.text_end;
      di.format = UNW_INFO_FORMAT_REMOTE_TABLE;
      di.u.rti.segbase = im.eh_frame_hdr;
      di.u.rti.table_len = im.fde_count * 8 / sizeof(unw_word_t);  // two int32 an entry
      di.u.rti.table_data = im.eh_frame_hdr + 12;
      return _Ux86_64_dwarf_search_unwind_table(as, ip, &di, pi, need_unwind_info, arg);
    }
  return _UPT_find_proc_info(as, ip, pi, need_unwind_info, arg);
}

int get_proc_name(unw_addr_space_t as, unw_word_t ip, char* buf, size_t len, unw_word_t* off,
                  void* arg) {
  if (StackUnwinder::Impl* u = t_current)
    if (const Mapping* m = u->find(ip); m && m->deleted) {
      const Image& im = u->image_of(*m);
      const uint64_t at = ip - im.bias;
      auto it = std::upper_bound(im.symbols.begin(), im.symbols.end(), at,
                                 [](uint64_t a, const Symbol& s) { return a < s.start; });
      if (it == im.symbols.begin() || len == 0) return -UNW_ENOINFO;
      --it;
      if (at >= it->start + it->size) return -UNW_ENOINFO;
      std::snprintf(buf, len, "%s", it->name.c_str());
      *off = at - it->start;
      return it->name.size() < len ? 0 : -UNW_ENOMEM;
    }
  return _UPT_get_proc_name(as, ip, buf, len, off, arg);
}

unw_accessors_t make_accessors() {
  unw_accessors_t a = _UPT_accessors;
  a.find_proc_info = find_proc_info;
  a.get_proc_name = get_proc_name;
  return a;
}

}  // namespace

std::string StackUnwinder::Impl::frame_text(unw_cursor_t& c, unw_word_t ip, bool innermost) {
  auto cached = names.find({ip, innermost});
  if (cached != names.end()) return cached->second;
  // A return address points past its call: look the caller up by the call itself.
  const Mapping* m = find(innermost ? ip : ip - 1);
  const std::string module = m ? m->module : "?";
  char name[1024] = {0};
  unw_word_t off = 0;
  const int rc = unw_get_proc_name(&c, name, sizeof(name), &off);
  char buf[64];
  std::string text;
  if (rc == 0 || (rc == -UNW_ENOMEM && name[0] != '\0')) {  // ENOMEM: cut to fit
    std::snprintf(buf, sizeof(buf), "+0x%" PRIx64 " (", uint64_t(off));
    text = demangle(name) + buf + module + ")";
  } else {
    std::snprintf(buf, sizeof(buf), "+0x%" PRIx64 ")",
                  m ? uint64_t(ip - m->start + m->offset) : uint64_t(0));
    text = "?? (" + module + buf;
  }
  names.emplace(std::make_pair(ip, innermost), text);
  return text;
}

StackUnwinder::StackUnwinder(pid_t pid) : impl_(std::make_unique<Impl>()) {
  static unw_accessors_t accessors = make_accessors();
  impl_->pid = pid;
  impl_->maps = read_maps(pid);
  impl_->as = unw_create_addr_space(&accessors, 0);
  // One address space per capture: its caches hold for every thread of this process.
  if (impl_->as) (void)unw_set_caching_policy(impl_->as, UNW_CACHE_GLOBAL);
}

StackUnwinder::~StackUnwinder() {
  if (impl_->as) unw_destroy_addr_space(impl_->as);
  if (impl_->mem_fd >= 0) ::close(impl_->mem_fd);
}

std::string StackUnwinder::unwind(int tid, std::vector<std::string>* frames) {
  if (!impl_->as) return "libunwind: cannot create an address space";
  void* upt = _UPT_create(tid);
  if (!upt) return "libunwind: _UPT_create failed";
  struct Current {  // the callbacks find this unwinder while it runs
    explicit Current(Impl* u) { t_current = u; }
    ~Current() { t_current = nullptr; }
  } current(impl_.get());
  std::string error;
  unw_cursor_t c;
  int rc = unw_init_remote(&c, impl_->as, upt);
  if (rc < 0) error = detail::concat("unw_init_remote: ", unw_strerror(rc));
  for (int n = 0; rc >= 0; ++n) {
    if (n == kMaxFrames) {
      error = detail::concat("cut at ", kMaxFrames, " frames");
      break;
    }
    unw_word_t ip = 0;
    rc = unw_get_reg(&c, UNW_REG_IP, &ip);
    if (rc < 0) {
      error = detail::concat("unw_get_reg: ", unw_strerror(rc));
      break;
    }
    if (ip == 0) break;
    frames->push_back(impl_->frame_text(c, ip, n == 0));
    rc = unw_step(&c);
    if (rc == 0) break;
    if (rc < 0) error = detail::concat("unwinding stopped: ", unw_strerror(rc));
  }
  _UPT_destroy(upt);
  return error;
}

}  // namespace keel
