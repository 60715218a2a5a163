// driver.cpp: the main() of a sanitizer build (AddressSanitizer + UBSan, or ThreadSanitizer).
//
// A sanitizer runtime cannot be loaded into the Python process after the fact, so a routine built
// with -fsanitize runs as its own executable: harness.py writes the buffers to a file, this
// program gives each buffer its own heap allocation of exactly its size (so a read one past the
// end hits AddressSanitizer's redzone), runs the routine, and writes the buffers back.
//
// Input file: uint32 n_buffers, uint32 n_symbols, n_buffers uint64 byte sizes, the buffers'
// bytes in order, n_symbols int64 index values. Output file: the buffers' bytes in order.
// Standard output: the routine's status (0, or the number of the runtime check that failed).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

extern "C" int ocannl_routine(void* const* buffers, const long* symbols);

static void fail(const char* what, const char* path) {
  std::fprintf(stderr, "metal shim driver: %s %s\n", what, path);
  std::exit(2);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: %s INPUT OUTPUT\n", argv[0]);
    return 2;
  }
  std::FILE* in = std::fopen(argv[1], "rb");
  if (!in) fail("cannot read", argv[1]);
  std::uint32_t counts[2];
  if (std::fread(counts, sizeof counts, 1, in) != 1) fail("truncated header in", argv[1]);
  std::vector<std::uint64_t> sizes(counts[0]);
  if (counts[0] && std::fread(sizes.data(), 8, counts[0], in) != counts[0]) fail("truncated sizes in", argv[1]);
  std::vector<void*> buffers(counts[0]);
  for (std::uint32_t k = 0; k < counts[0]; ++k) {
    buffers[k] = std::malloc(sizes[k] ? sizes[k] : 1);
    if (sizes[k] && std::fread(buffers[k], 1, sizes[k], in) != sizes[k]) fail("truncated buffer in", argv[1]);
  }
  static_assert(sizeof(long) == 8, "index symbols are 64-bit");
  std::vector<long> symbols(counts[1] + 1);
  if (counts[1] && std::fread(symbols.data(), 8, counts[1], in) != counts[1]) fail("truncated symbols in", argv[1]);
  std::fclose(in);

  const int status = ocannl_routine(buffers.data(), symbols.data());

  std::FILE* out = std::fopen(argv[2], "wb");
  if (!out) fail("cannot write", argv[2]);
  for (std::uint32_t k = 0; k < counts[0]; ++k) {
    if (sizes[k] && std::fwrite(buffers[k], 1, sizes[k], out) != sizes[k]) fail("cannot write", argv[2]);
    std::free(buffers[k]);
  }
  std::fclose(out);
  std::printf("%d\n", status);
  return 0;
}
