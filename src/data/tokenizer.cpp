#include "data/tokenizer.h"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>

#include "core/error.h"

namespace loom {
namespace {

// ---- UTF-8 ----------------------------------------------------------------------------------

// Decodes the code point at s[i] into `c` and returns its length in bytes, or 0 when the bytes
// there are not valid UTF-8 (RFC 3629: no overlong forms, no surrogates, nothing above U+10FFFF).
int utf8_decode(std::string_view s, size_t i, char32_t& c) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    c = b0;
    return 1;
  }
  int len;
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
    c = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    c = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    c = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return 0;
  }
  if (i + static_cast<size_t>(len) > s.size()) return 0;
  for (int k = 1; k < len; ++k) {
    const auto b = static_cast<unsigned char>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
    c = (c << 6) | (b & 0x3F);
  }
  return len;
}

std::string hex(uint32_t v, int digits) {
  static const char* kDigits = "0123456789ABCDEF";
  std::string s(static_cast<size_t>(digits), '0');
  for (int k = digits - 1; k >= 0; --k, v >>= 4) s[static_cast<size_t>(k)] = kDigits[v & 15];
  return s;
}

// "'a' (U+0061)", "'\n' (U+000A)", "'é' (U+00E9)": readable and unambiguous in a message.
std::string describe_char(char32_t c) {
  std::string s = "'";
  if (c == '\n')
    s += "\\n";
  else if (c == '\t')
    s += "\\t";
  else if (c == '\r')
    s += "\\r";
  else if (c < 0x20 || c == 0x7F || (c >= 0x80 && c < 0xA0))
    s += "?";
  else
    utf8_append(s, c);
  s += "' (U+";
  s += hex(static_cast<uint32_t>(c), c > 0xFFFF ? 6 : 4);
  s += ")";
  return s;
}

[[noreturn]] void invalid_utf8(std::string_view text, size_t offset, const std::string& subject) {
  std::string msg = "is not valid UTF-8: byte 0x";
  msg += hex(static_cast<unsigned char>(text[offset]), 2);
  msg += " at byte offset ";
  msg += std::to_string(offset);
  msg += " does not start a valid character";
  throw UserError(subject, msg, "save the text as UTF-8 (e.g. iconv -f LATIN1 -t UTF-8 IN > OUT)");
}

std::string read_text_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  if (!f) {
    const int e = errno;
    std::string msg = "cannot be opened (";
    msg += std::strerror(e);
    msg += ")";
    throw UserError(path, msg, "check the path");
  }
  std::string s{std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
  if (f.bad()) throw UserError(path, "could not be read to the end", "check the file and the disk");
  return s;
}

// ---- Unicode classes for GPT-2's pre-tokenizer ----------------------------------------------

enum CpClass : uint8_t { kOther, kLetter, kNumber, kSpace };

struct CpRange {
  uint32_t lo, hi;
};

// \p{L} and \p{N} above ASCII, as the Python `regex` module 2026.5.9 (Unicode 17) classifies
// code points; generated with:
//   r = regex.compile(r"\p{L}")  # and r"\p{N}"
//   ranges of c in [0x80, 0x10FFFF] (surrogates excluded) with r.fullmatch(chr(c))
// Sorted, disjoint, adjacent ranges merged.
constexpr CpRange kLetterRanges[] = {
    {0xAA, 0xAA},       {0xB5, 0xB5},       {0xBA, 0xBA},       {0xC0, 0xD6},       {0xD8, 0xF6},
    {0xF8, 0x2C1},      {0x2C6, 0x2D1},     {0x2E0, 0x2E4},     {0x2EC, 0x2EC},     {0x2EE, 0x2EE},
    {0x370, 0x374},     {0x376, 0x377},     {0x37A, 0x37D},     {0x37F, 0x37F},     {0x386, 0x386},
    {0x388, 0x38A},     {0x38C, 0x38C},     {0x38E, 0x3A1},     {0x3A3, 0x3F5},     {0x3F7, 0x481},
    {0x48A, 0x52F},     {0x531, 0x556},     {0x559, 0x559},     {0x560, 0x588},     {0x5D0, 0x5EA},
    {0x5EF, 0x5F2},     {0x620, 0x64A},     {0x66E, 0x66F},     {0x671, 0x6D3},     {0x6D5, 0x6D5},
    {0x6E5, 0x6E6},     {0x6EE, 0x6EF},     {0x6FA, 0x6FC},     {0x6FF, 0x6FF},     {0x710, 0x710},
    {0x712, 0x72F},     {0x74D, 0x7A5},     {0x7B1, 0x7B1},     {0x7CA, 0x7EA},     {0x7F4, 0x7F5},
    {0x7FA, 0x7FA},     {0x800, 0x815},     {0x81A, 0x81A},     {0x824, 0x824},     {0x828, 0x828},
    {0x840, 0x858},     {0x860, 0x86A},     {0x870, 0x887},     {0x889, 0x88F},     {0x8A0, 0x8C9},
    {0x904, 0x939},     {0x93D, 0x93D},     {0x950, 0x950},     {0x958, 0x961},     {0x971, 0x980},
    {0x985, 0x98C},     {0x98F, 0x990},     {0x993, 0x9A8},     {0x9AA, 0x9B0},     {0x9B2, 0x9B2},
    {0x9B6, 0x9B9},     {0x9BD, 0x9BD},     {0x9CE, 0x9CE},     {0x9DC, 0x9DD},     {0x9DF, 0x9E1},
    {0x9F0, 0x9F1},     {0x9FC, 0x9FC},     {0xA05, 0xA0A},     {0xA0F, 0xA10},     {0xA13, 0xA28},
    {0xA2A, 0xA30},     {0xA32, 0xA33},     {0xA35, 0xA36},     {0xA38, 0xA39},     {0xA59, 0xA5C},
    {0xA5E, 0xA5E},     {0xA72, 0xA74},     {0xA85, 0xA8D},     {0xA8F, 0xA91},     {0xA93, 0xAA8},
    {0xAAA, 0xAB0},     {0xAB2, 0xAB3},     {0xAB5, 0xAB9},     {0xABD, 0xABD},     {0xAD0, 0xAD0},
    {0xAE0, 0xAE1},     {0xAF9, 0xAF9},     {0xB05, 0xB0C},     {0xB0F, 0xB10},     {0xB13, 0xB28},
    {0xB2A, 0xB30},     {0xB32, 0xB33},     {0xB35, 0xB39},     {0xB3D, 0xB3D},     {0xB5C, 0xB5D},
    {0xB5F, 0xB61},     {0xB71, 0xB71},     {0xB83, 0xB83},     {0xB85, 0xB8A},     {0xB8E, 0xB90},
    {0xB92, 0xB95},     {0xB99, 0xB9A},     {0xB9C, 0xB9C},     {0xB9E, 0xB9F},     {0xBA3, 0xBA4},
    {0xBA8, 0xBAA},     {0xBAE, 0xBB9},     {0xBD0, 0xBD0},     {0xC05, 0xC0C},     {0xC0E, 0xC10},
    {0xC12, 0xC28},     {0xC2A, 0xC39},     {0xC3D, 0xC3D},     {0xC58, 0xC5A},     {0xC5C, 0xC5D},
    {0xC60, 0xC61},     {0xC80, 0xC80},     {0xC85, 0xC8C},     {0xC8E, 0xC90},     {0xC92, 0xCA8},
    {0xCAA, 0xCB3},     {0xCB5, 0xCB9},     {0xCBD, 0xCBD},     {0xCDC, 0xCDE},     {0xCE0, 0xCE1},
    {0xCF1, 0xCF2},     {0xD04, 0xD0C},     {0xD0E, 0xD10},     {0xD12, 0xD3A},     {0xD3D, 0xD3D},
    {0xD4E, 0xD4E},     {0xD54, 0xD56},     {0xD5F, 0xD61},     {0xD7A, 0xD7F},     {0xD85, 0xD96},
    {0xD9A, 0xDB1},     {0xDB3, 0xDBB},     {0xDBD, 0xDBD},     {0xDC0, 0xDC6},     {0xE01, 0xE30},
    {0xE32, 0xE33},     {0xE40, 0xE46},     {0xE81, 0xE82},     {0xE84, 0xE84},     {0xE86, 0xE8A},
    {0xE8C, 0xEA3},     {0xEA5, 0xEA5},     {0xEA7, 0xEB0},     {0xEB2, 0xEB3},     {0xEBD, 0xEBD},
    {0xEC0, 0xEC4},     {0xEC6, 0xEC6},     {0xEDC, 0xEDF},     {0xF00, 0xF00},     {0xF40, 0xF47},
    {0xF49, 0xF6C},     {0xF88, 0xF8C},     {0x1000, 0x102A},   {0x103F, 0x103F},   {0x1050, 0x1055},
    {0x105A, 0x105D},   {0x1061, 0x1061},   {0x1065, 0x1066},   {0x106E, 0x1070},   {0x1075, 0x1081},
    {0x108E, 0x108E},   {0x10A0, 0x10C5},   {0x10C7, 0x10C7},   {0x10CD, 0x10CD},   {0x10D0, 0x10FA},
    {0x10FC, 0x1248},   {0x124A, 0x124D},   {0x1250, 0x1256},   {0x1258, 0x1258},   {0x125A, 0x125D},
    {0x1260, 0x1288},   {0x128A, 0x128D},   {0x1290, 0x12B0},   {0x12B2, 0x12B5},   {0x12B8, 0x12BE},
    {0x12C0, 0x12C0},   {0x12C2, 0x12C5},   {0x12C8, 0x12D6},   {0x12D8, 0x1310},   {0x1312, 0x1315},
    {0x1318, 0x135A},   {0x1380, 0x138F},   {0x13A0, 0x13F5},   {0x13F8, 0x13FD},   {0x1401, 0x166C},
    {0x166F, 0x167F},   {0x1681, 0x169A},   {0x16A0, 0x16EA},   {0x16F1, 0x16F8},   {0x1700, 0x1711},
    {0x171F, 0x1731},   {0x1740, 0x1751},   {0x1760, 0x176C},   {0x176E, 0x1770},   {0x1780, 0x17B3},
    {0x17D7, 0x17D7},   {0x17DC, 0x17DC},   {0x1820, 0x1878},   {0x1880, 0x1884},   {0x1887, 0x18A8},
    {0x18AA, 0x18AA},   {0x18B0, 0x18F5},   {0x1900, 0x191E},   {0x1950, 0x196D},   {0x1970, 0x1974},
    {0x1980, 0x19AB},   {0x19B0, 0x19C9},   {0x1A00, 0x1A16},   {0x1A20, 0x1A54},   {0x1AA7, 0x1AA7},
    {0x1B05, 0x1B33},   {0x1B45, 0x1B4C},   {0x1B83, 0x1BA0},   {0x1BAE, 0x1BAF},   {0x1BBA, 0x1BE5},
    {0x1C00, 0x1C23},   {0x1C4D, 0x1C4F},   {0x1C5A, 0x1C7D},   {0x1C80, 0x1C8A},   {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF},   {0x1CE9, 0x1CEC},   {0x1CEE, 0x1CF3},   {0x1CF5, 0x1CF6},   {0x1CFA, 0x1CFA},
    {0x1D00, 0x1DBF},   {0x1E00, 0x1F15},   {0x1F18, 0x1F1D},   {0x1F20, 0x1F45},   {0x1F48, 0x1F4D},
    {0x1F50, 0x1F57},   {0x1F59, 0x1F59},   {0x1F5B, 0x1F5B},   {0x1F5D, 0x1F5D},   {0x1F5F, 0x1F7D},
    {0x1F80, 0x1FB4},   {0x1FB6, 0x1FBC},   {0x1FBE, 0x1FBE},   {0x1FC2, 0x1FC4},   {0x1FC6, 0x1FCC},
    {0x1FD0, 0x1FD3},   {0x1FD6, 0x1FDB},   {0x1FE0, 0x1FEC},   {0x1FF2, 0x1FF4},   {0x1FF6, 0x1FFC},
    {0x2071, 0x2071},   {0x207F, 0x207F},   {0x2090, 0x209C},   {0x2102, 0x2102},   {0x2107, 0x2107},
    {0x210A, 0x2113},   {0x2115, 0x2115},   {0x2119, 0x211D},   {0x2124, 0x2124},   {0x2126, 0x2126},
    {0x2128, 0x2128},   {0x212A, 0x212D},   {0x212F, 0x2139},   {0x213C, 0x213F},   {0x2145, 0x2149},
    {0x214E, 0x214E},   {0x2183, 0x2184},   {0x2C00, 0x2CE4},   {0x2CEB, 0x2CEE},   {0x2CF2, 0x2CF3},
    {0x2D00, 0x2D25},   {0x2D27, 0x2D27},   {0x2D2D, 0x2D2D},   {0x2D30, 0x2D67},   {0x2D6F, 0x2D6F},
    {0x2D80, 0x2D96},   {0x2DA0, 0x2DA6},   {0x2DA8, 0x2DAE},   {0x2DB0, 0x2DB6},   {0x2DB8, 0x2DBE},
    {0x2DC0, 0x2DC6},   {0x2DC8, 0x2DCE},   {0x2DD0, 0x2DD6},   {0x2DD8, 0x2DDE},   {0x2E2F, 0x2E2F},
    {0x3005, 0x3006},   {0x3031, 0x3035},   {0x303B, 0x303C},   {0x3041, 0x3096},   {0x309D, 0x309F},
    {0x30A1, 0x30FA},   {0x30FC, 0x30FF},   {0x3105, 0x312F},   {0x3131, 0x318E},   {0x31A0, 0x31BF},
    {0x31F0, 0x31FF},   {0x3400, 0x4DBF},   {0x4E00, 0xA48C},   {0xA4D0, 0xA4FD},   {0xA500, 0xA60C},
    {0xA610, 0xA61F},   {0xA62A, 0xA62B},   {0xA640, 0xA66E},   {0xA67F, 0xA69D},   {0xA6A0, 0xA6E5},
    {0xA717, 0xA71F},   {0xA722, 0xA788},   {0xA78B, 0xA7DC},   {0xA7F1, 0xA801},   {0xA803, 0xA805},
    {0xA807, 0xA80A},   {0xA80C, 0xA822},   {0xA840, 0xA873},   {0xA882, 0xA8B3},   {0xA8F2, 0xA8F7},
    {0xA8FB, 0xA8FB},   {0xA8FD, 0xA8FE},   {0xA90A, 0xA925},   {0xA930, 0xA946},   {0xA960, 0xA97C},
    {0xA984, 0xA9B2},   {0xA9CF, 0xA9CF},   {0xA9E0, 0xA9E4},   {0xA9E6, 0xA9EF},   {0xA9FA, 0xA9FE},
    {0xAA00, 0xAA28},   {0xAA40, 0xAA42},   {0xAA44, 0xAA4B},   {0xAA60, 0xAA76},   {0xAA7A, 0xAA7A},
    {0xAA7E, 0xAAAF},   {0xAAB1, 0xAAB1},   {0xAAB5, 0xAAB6},   {0xAAB9, 0xAABD},   {0xAAC0, 0xAAC0},
    {0xAAC2, 0xAAC2},   {0xAADB, 0xAADD},   {0xAAE0, 0xAAEA},   {0xAAF2, 0xAAF4},   {0xAB01, 0xAB06},
    {0xAB09, 0xAB0E},   {0xAB11, 0xAB16},   {0xAB20, 0xAB26},   {0xAB28, 0xAB2E},   {0xAB30, 0xAB5A},
    {0xAB5C, 0xAB69},   {0xAB70, 0xABE2},   {0xAC00, 0xD7A3},   {0xD7B0, 0xD7C6},   {0xD7CB, 0xD7FB},
    {0xF900, 0xFA6D},   {0xFA70, 0xFAD9},   {0xFB00, 0xFB06},   {0xFB13, 0xFB17},   {0xFB1D, 0xFB1D},
    {0xFB1F, 0xFB28},   {0xFB2A, 0xFB36},   {0xFB38, 0xFB3C},   {0xFB3E, 0xFB3E},   {0xFB40, 0xFB41},
    {0xFB43, 0xFB44},   {0xFB46, 0xFBB1},   {0xFBD3, 0xFD3D},   {0xFD50, 0xFD8F},   {0xFD92, 0xFDC7},
    {0xFDF0, 0xFDFB},   {0xFE70, 0xFE74},   {0xFE76, 0xFEFC},   {0xFF21, 0xFF3A},   {0xFF41, 0xFF5A},
    {0xFF66, 0xFFBE},   {0xFFC2, 0xFFC7},   {0xFFCA, 0xFFCF},   {0xFFD2, 0xFFD7},   {0xFFDA, 0xFFDC},
    {0x10000, 0x1000B}, {0x1000D, 0x10026}, {0x10028, 0x1003A}, {0x1003C, 0x1003D}, {0x1003F, 0x1004D},
    {0x10050, 0x1005D}, {0x10080, 0x100FA}, {0x10280, 0x1029C}, {0x102A0, 0x102D0}, {0x10300, 0x1031F},
    {0x1032D, 0x10340}, {0x10342, 0x10349}, {0x10350, 0x10375}, {0x10380, 0x1039D}, {0x103A0, 0x103C3},
    {0x103C8, 0x103CF}, {0x10400, 0x1049D}, {0x104B0, 0x104D3}, {0x104D8, 0x104FB}, {0x10500, 0x10527},
    {0x10530, 0x10563}, {0x10570, 0x1057A}, {0x1057C, 0x1058A}, {0x1058C, 0x10592}, {0x10594, 0x10595},
    {0x10597, 0x105A1}, {0x105A3, 0x105B1}, {0x105B3, 0x105B9}, {0x105BB, 0x105BC}, {0x105C0, 0x105F3},
    {0x10600, 0x10736}, {0x10740, 0x10755}, {0x10760, 0x10767}, {0x10780, 0x10785}, {0x10787, 0x107B0},
    {0x107B2, 0x107BA}, {0x10800, 0x10805}, {0x10808, 0x10808}, {0x1080A, 0x10835}, {0x10837, 0x10838},
    {0x1083C, 0x1083C}, {0x1083F, 0x10855}, {0x10860, 0x10876}, {0x10880, 0x1089E}, {0x108E0, 0x108F2},
    {0x108F4, 0x108F5}, {0x10900, 0x10915}, {0x10920, 0x10939}, {0x10940, 0x10959}, {0x10980, 0x109B7},
    {0x109BE, 0x109BF}, {0x10A00, 0x10A00}, {0x10A10, 0x10A13}, {0x10A15, 0x10A17}, {0x10A19, 0x10A35},
    {0x10A60, 0x10A7C}, {0x10A80, 0x10A9C}, {0x10AC0, 0x10AC7}, {0x10AC9, 0x10AE4}, {0x10B00, 0x10B35},
    {0x10B40, 0x10B55}, {0x10B60, 0x10B72}, {0x10B80, 0x10B91}, {0x10C00, 0x10C48}, {0x10C80, 0x10CB2},
    {0x10CC0, 0x10CF2}, {0x10D00, 0x10D23}, {0x10D4A, 0x10D65}, {0x10D6F, 0x10D85}, {0x10E80, 0x10EA9},
    {0x10EB0, 0x10EB1}, {0x10EC2, 0x10EC7}, {0x10F00, 0x10F1C}, {0x10F27, 0x10F27}, {0x10F30, 0x10F45},
    {0x10F70, 0x10F81}, {0x10FB0, 0x10FC4}, {0x10FE0, 0x10FF6}, {0x11003, 0x11037}, {0x11071, 0x11072},
    {0x11075, 0x11075}, {0x11083, 0x110AF}, {0x110D0, 0x110E8}, {0x11103, 0x11126}, {0x11144, 0x11144},
    {0x11147, 0x11147}, {0x11150, 0x11172}, {0x11176, 0x11176}, {0x11183, 0x111B2}, {0x111C1, 0x111C4},
    {0x111DA, 0x111DA}, {0x111DC, 0x111DC}, {0x11200, 0x11211}, {0x11213, 0x1122B}, {0x1123F, 0x11240},
    {0x11280, 0x11286}, {0x11288, 0x11288}, {0x1128A, 0x1128D}, {0x1128F, 0x1129D}, {0x1129F, 0x112A8},
    {0x112B0, 0x112DE}, {0x11305, 0x1130C}, {0x1130F, 0x11310}, {0x11313, 0x11328}, {0x1132A, 0x11330},
    {0x11332, 0x11333}, {0x11335, 0x11339}, {0x1133D, 0x1133D}, {0x11350, 0x11350}, {0x1135D, 0x11361},
    {0x11380, 0x11389}, {0x1138B, 0x1138B}, {0x1138E, 0x1138E}, {0x11390, 0x113B5}, {0x113B7, 0x113B7},
    {0x113D1, 0x113D1}, {0x113D3, 0x113D3}, {0x11400, 0x11434}, {0x11447, 0x1144A}, {0x1145F, 0x11461},
    {0x11480, 0x114AF}, {0x114C4, 0x114C5}, {0x114C7, 0x114C7}, {0x11580, 0x115AE}, {0x115D8, 0x115DB},
    {0x11600, 0x1162F}, {0x11644, 0x11644}, {0x11680, 0x116AA}, {0x116B8, 0x116B8}, {0x11700, 0x1171A},
    {0x11740, 0x11746}, {0x11800, 0x1182B}, {0x118A0, 0x118DF}, {0x118FF, 0x11906}, {0x11909, 0x11909},
    {0x1190C, 0x11913}, {0x11915, 0x11916}, {0x11918, 0x1192F}, {0x1193F, 0x1193F}, {0x11941, 0x11941},
    {0x119A0, 0x119A7}, {0x119AA, 0x119D0}, {0x119E1, 0x119E1}, {0x119E3, 0x119E3}, {0x11A00, 0x11A00},
    {0x11A0B, 0x11A32}, {0x11A3A, 0x11A3A}, {0x11A50, 0x11A50}, {0x11A5C, 0x11A89}, {0x11A9D, 0x11A9D},
    {0x11AB0, 0x11AF8}, {0x11BC0, 0x11BE0}, {0x11C00, 0x11C08}, {0x11C0A, 0x11C2E}, {0x11C40, 0x11C40},
    {0x11C72, 0x11C8F}, {0x11D00, 0x11D06}, {0x11D08, 0x11D09}, {0x11D0B, 0x11D30}, {0x11D46, 0x11D46},
    {0x11D60, 0x11D65}, {0x11D67, 0x11D68}, {0x11D6A, 0x11D89}, {0x11D98, 0x11D98}, {0x11DB0, 0x11DDB},
    {0x11EE0, 0x11EF2}, {0x11F02, 0x11F02}, {0x11F04, 0x11F10}, {0x11F12, 0x11F33}, {0x11FB0, 0x11FB0},
    {0x12000, 0x12399}, {0x12480, 0x12543}, {0x12F90, 0x12FF0}, {0x13000, 0x1342F}, {0x13441, 0x13446},
    {0x13460, 0x143FA}, {0x14400, 0x14646}, {0x16100, 0x1611D}, {0x16800, 0x16A38}, {0x16A40, 0x16A5E},
    {0x16A70, 0x16ABE}, {0x16AD0, 0x16AED}, {0x16B00, 0x16B2F}, {0x16B40, 0x16B43}, {0x16B63, 0x16B77},
    {0x16B7D, 0x16B8F}, {0x16D40, 0x16D6C}, {0x16E40, 0x16E7F}, {0x16EA0, 0x16EB8}, {0x16EBB, 0x16ED3},
    {0x16F00, 0x16F4A}, {0x16F50, 0x16F50}, {0x16F93, 0x16F9F}, {0x16FE0, 0x16FE1}, {0x16FE3, 0x16FE3},
    {0x16FF2, 0x16FF3}, {0x17000, 0x18CD5}, {0x18CFF, 0x18D1E}, {0x18D80, 0x18DF2}, {0x1AFF0, 0x1AFF3},
    {0x1AFF5, 0x1AFFB}, {0x1AFFD, 0x1AFFE}, {0x1B000, 0x1B122}, {0x1B132, 0x1B132}, {0x1B150, 0x1B152},
    {0x1B155, 0x1B155}, {0x1B164, 0x1B167}, {0x1B170, 0x1B2FB}, {0x1BC00, 0x1BC6A}, {0x1BC70, 0x1BC7C},
    {0x1BC80, 0x1BC88}, {0x1BC90, 0x1BC99}, {0x1D400, 0x1D454}, {0x1D456, 0x1D49C}, {0x1D49E, 0x1D49F},
    {0x1D4A2, 0x1D4A2}, {0x1D4A5, 0x1D4A6}, {0x1D4A9, 0x1D4AC}, {0x1D4AE, 0x1D4B9}, {0x1D4BB, 0x1D4BB},
    {0x1D4BD, 0x1D4C3}, {0x1D4C5, 0x1D505}, {0x1D507, 0x1D50A}, {0x1D50D, 0x1D514}, {0x1D516, 0x1D51C},
    {0x1D51E, 0x1D539}, {0x1D53B, 0x1D53E}, {0x1D540, 0x1D544}, {0x1D546, 0x1D546}, {0x1D54A, 0x1D550},
    {0x1D552, 0x1D6A5}, {0x1D6A8, 0x1D6C0}, {0x1D6C2, 0x1D6DA}, {0x1D6DC, 0x1D6FA}, {0x1D6FC, 0x1D714},
    {0x1D716, 0x1D734}, {0x1D736, 0x1D74E}, {0x1D750, 0x1D76E}, {0x1D770, 0x1D788}, {0x1D78A, 0x1D7A8},
    {0x1D7AA, 0x1D7C2}, {0x1D7C4, 0x1D7CB}, {0x1DF00, 0x1DF1E}, {0x1DF25, 0x1DF2A}, {0x1E030, 0x1E06D},
    {0x1E100, 0x1E12C}, {0x1E137, 0x1E13D}, {0x1E14E, 0x1E14E}, {0x1E290, 0x1E2AD}, {0x1E2C0, 0x1E2EB},
    {0x1E4D0, 0x1E4EB}, {0x1E5D0, 0x1E5ED}, {0x1E5F0, 0x1E5F0}, {0x1E6C0, 0x1E6DE}, {0x1E6E0, 0x1E6E2},
    {0x1E6E4, 0x1E6E5}, {0x1E6E7, 0x1E6ED}, {0x1E6F0, 0x1E6F4}, {0x1E6FE, 0x1E6FF}, {0x1E7E0, 0x1E7E6},
    {0x1E7E8, 0x1E7EB}, {0x1E7ED, 0x1E7EE}, {0x1E7F0, 0x1E7FE}, {0x1E800, 0x1E8C4}, {0x1E900, 0x1E943},
    {0x1E94B, 0x1E94B}, {0x1EE00, 0x1EE03}, {0x1EE05, 0x1EE1F}, {0x1EE21, 0x1EE22}, {0x1EE24, 0x1EE24},
    {0x1EE27, 0x1EE27}, {0x1EE29, 0x1EE32}, {0x1EE34, 0x1EE37}, {0x1EE39, 0x1EE39}, {0x1EE3B, 0x1EE3B},
    {0x1EE42, 0x1EE42}, {0x1EE47, 0x1EE47}, {0x1EE49, 0x1EE49}, {0x1EE4B, 0x1EE4B}, {0x1EE4D, 0x1EE4F},
    {0x1EE51, 0x1EE52}, {0x1EE54, 0x1EE54}, {0x1EE57, 0x1EE57}, {0x1EE59, 0x1EE59}, {0x1EE5B, 0x1EE5B},
    {0x1EE5D, 0x1EE5D}, {0x1EE5F, 0x1EE5F}, {0x1EE61, 0x1EE62}, {0x1EE64, 0x1EE64}, {0x1EE67, 0x1EE6A},
    {0x1EE6C, 0x1EE72}, {0x1EE74, 0x1EE77}, {0x1EE79, 0x1EE7C}, {0x1EE7E, 0x1EE7E}, {0x1EE80, 0x1EE89},
    {0x1EE8B, 0x1EE9B}, {0x1EEA1, 0x1EEA3}, {0x1EEA5, 0x1EEA9}, {0x1EEAB, 0x1EEBB}, {0x20000, 0x2A6DF},
    {0x2A700, 0x2B81D}, {0x2B820, 0x2CEAD}, {0x2CEB0, 0x2EBE0}, {0x2EBF0, 0x2EE5D}, {0x2F800, 0x2FA1D},
    {0x30000, 0x3134A}, {0x31350, 0x33479},
};
constexpr CpRange kNumberRanges[] = {
    {0xB2, 0xB3},       {0xB9, 0xB9},       {0xBC, 0xBE},       {0x660, 0x669},     {0x6F0, 0x6F9},
    {0x7C0, 0x7C9},     {0x966, 0x96F},     {0x9E6, 0x9EF},     {0x9F4, 0x9F9},     {0xA66, 0xA6F},
    {0xAE6, 0xAEF},     {0xB66, 0xB6F},     {0xB72, 0xB77},     {0xBE6, 0xBF2},     {0xC66, 0xC6F},
    {0xC78, 0xC7E},     {0xCE6, 0xCEF},     {0xD58, 0xD5E},     {0xD66, 0xD78},     {0xDE6, 0xDEF},
    {0xE50, 0xE59},     {0xED0, 0xED9},     {0xF20, 0xF33},     {0x1040, 0x1049},   {0x1090, 0x1099},
    {0x1369, 0x137C},   {0x16EE, 0x16F0},   {0x17E0, 0x17E9},   {0x17F0, 0x17F9},   {0x1810, 0x1819},
    {0x1946, 0x194F},   {0x19D0, 0x19DA},   {0x1A80, 0x1A89},   {0x1A90, 0x1A99},   {0x1B50, 0x1B59},
    {0x1BB0, 0x1BB9},   {0x1C40, 0x1C49},   {0x1C50, 0x1C59},   {0x2070, 0x2070},   {0x2074, 0x2079},
    {0x2080, 0x2089},   {0x2150, 0x2182},   {0x2185, 0x2189},   {0x2460, 0x249B},   {0x24EA, 0x24FF},
    {0x2776, 0x2793},   {0x2CFD, 0x2CFD},   {0x3007, 0x3007},   {0x3021, 0x3029},   {0x3038, 0x303A},
    {0x3192, 0x3195},   {0x3220, 0x3229},   {0x3248, 0x324F},   {0x3251, 0x325F},   {0x3280, 0x3289},
    {0x32B1, 0x32BF},   {0xA620, 0xA629},   {0xA6E6, 0xA6EF},   {0xA830, 0xA835},   {0xA8D0, 0xA8D9},
    {0xA900, 0xA909},   {0xA9D0, 0xA9D9},   {0xA9F0, 0xA9F9},   {0xAA50, 0xAA59},   {0xABF0, 0xABF9},
    {0xFF10, 0xFF19},   {0x10107, 0x10133}, {0x10140, 0x10178}, {0x1018A, 0x1018B}, {0x102E1, 0x102FB},
    {0x10320, 0x10323}, {0x10341, 0x10341}, {0x1034A, 0x1034A}, {0x103D1, 0x103D5}, {0x104A0, 0x104A9},
    {0x10858, 0x1085F}, {0x10879, 0x1087F}, {0x108A7, 0x108AF}, {0x108FB, 0x108FF}, {0x10916, 0x1091B},
    {0x109BC, 0x109BD}, {0x109C0, 0x109CF}, {0x109D2, 0x109FF}, {0x10A40, 0x10A48}, {0x10A7D, 0x10A7E},
    {0x10A9D, 0x10A9F}, {0x10AEB, 0x10AEF}, {0x10B58, 0x10B5F}, {0x10B78, 0x10B7F}, {0x10BA9, 0x10BAF},
    {0x10CFA, 0x10CFF}, {0x10D30, 0x10D39}, {0x10D40, 0x10D49}, {0x10E60, 0x10E7E}, {0x10F1D, 0x10F26},
    {0x10F51, 0x10F54}, {0x10FC5, 0x10FCB}, {0x11052, 0x1106F}, {0x110F0, 0x110F9}, {0x11136, 0x1113F},
    {0x111D0, 0x111D9}, {0x111E1, 0x111F4}, {0x112F0, 0x112F9}, {0x11450, 0x11459}, {0x114D0, 0x114D9},
    {0x11650, 0x11659}, {0x116C0, 0x116C9}, {0x116D0, 0x116E3}, {0x11730, 0x1173B}, {0x118E0, 0x118F2},
    {0x11950, 0x11959}, {0x11BF0, 0x11BF9}, {0x11C50, 0x11C6C}, {0x11D50, 0x11D59}, {0x11DA0, 0x11DA9},
    {0x11DE0, 0x11DE9}, {0x11F50, 0x11F59}, {0x11FC0, 0x11FD4}, {0x12400, 0x1246E}, {0x16130, 0x16139},
    {0x16A60, 0x16A69}, {0x16AC0, 0x16AC9}, {0x16B50, 0x16B59}, {0x16B5B, 0x16B61}, {0x16D70, 0x16D79},
    {0x16E80, 0x16E96}, {0x16FF4, 0x16FF6}, {0x1CCF0, 0x1CCF9}, {0x1D2C0, 0x1D2D3}, {0x1D2E0, 0x1D2F3},
    {0x1D360, 0x1D378}, {0x1D7CE, 0x1D7FF}, {0x1E140, 0x1E149}, {0x1E2F0, 0x1E2F9}, {0x1E4F0, 0x1E4F9},
    {0x1E5F1, 0x1E5FA}, {0x1E8C7, 0x1E8CF}, {0x1E950, 0x1E959}, {0x1EC71, 0x1ECAB}, {0x1ECAD, 0x1ECAF},
    {0x1ECB1, 0x1ECB4}, {0x1ED01, 0x1ED2D}, {0x1ED2F, 0x1ED3D}, {0x1F100, 0x1F10C}, {0x1FBF0, 0x1FBF9},
};

bool in_ranges(const CpRange* begin, const CpRange* end, uint32_t c) {
  const CpRange* it = std::upper_bound(begin, end, c, [](uint32_t v, const CpRange& r) { return v < r.lo; });
  return it != begin && c <= (it - 1)->hi;
}

constexpr std::array<CpClass, 128> make_ascii_classes() {
  std::array<CpClass, 128> t{};
  for (int c = 0; c < 128; ++c) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'))
      t[c] = kLetter;
    else if (c >= '0' && c <= '9')
      t[c] = kNumber;
    else if ((c >= 0x09 && c <= 0x0D) || c == ' ')
      t[c] = kSpace;
    else
      t[c] = kOther;
  }
  return t;
}
constexpr std::array<CpClass, 128> kAsciiClass = make_ascii_classes();

CpClass classify(char32_t c) {
  if (c < 128) return kAsciiClass[c];
  switch (c) {  // Unicode White_Space above ASCII
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return kSpace;
    default:
      break;
  }
  if (c >= 0x2000 && c <= 0x200A) return kSpace;
  if (in_ranges(std::begin(kLetterRanges), std::end(kLetterRanges), c)) return kLetter;
  if (in_ranges(std::begin(kNumberRanges), std::end(kNumberRanges), c)) return kNumber;
  return kOther;
}

}  // namespace

// ---- UTF-8 (public helpers) -----------------------------------------------------------------

void utf8_append(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else if (c < 0x800) {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += static_cast<char>(0xE0 | (c >> 12));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (c >> 18));
    out += static_cast<char>(0x80 | ((c >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((c >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
}

int64_t utf8_length(std::string_view text, const std::string& subject) {
  int64_t n = 0;
  for (size_t i = 0; i < text.size(); ++n) {
    if (static_cast<unsigned char>(text[i]) < 0x80) {  // the common case, without the decoder
      ++i;
      continue;
    }
    char32_t c;
    const int len = utf8_decode(text, i, c);
    if (len == 0) invalid_utf8(text, i, subject);
    i += static_cast<size_t>(len);
  }
  return n;
}

size_t utf8_offset(std::string_view text, int64_t k) {
  size_t i = 0;
  for (int64_t n = 0; n < k; ++n) {
    LOOM_ASSERT(i < text.size(), "utf8_offset: k is past the end of the text");
    // In valid UTF-8 every byte that is not a continuation byte starts a character.
    ++i;
    while (i < text.size() && (static_cast<unsigned char>(text[i]) & 0xC0) == 0x80) ++i;
  }
  return i;
}

// ---- Tokenizer ------------------------------------------------------------------------------

std::unique_ptr<Tokenizer> Tokenizer::from_json(const nlohmann::json& j, const std::string& source) {
  const std::string fix = "prepare the data again with `loom prepare`";
  if (!j.is_object()) throw UserError(source, "\"tokenizer\" is not a JSON object", fix);
  auto field = [&](const char* key) -> const nlohmann::json& {
    auto it = j.find(key);
    if (it == j.end()) {
      std::string msg = "\"tokenizer\" has no \"";
      msg += key;
      msg += "\" field";
      throw UserError(source, msg, fix);
    }
    return *it;
  };
  auto bad = [&](const char* key, const std::string& what) -> UserError {
    std::string msg = "\"tokenizer.";
    msg += key;
    msg += "\" ";
    msg += what;
    return UserError(source, msg, fix);
  };
  const nlohmann::json& kind = field("kind");
  if (!kind.is_string()) throw bad("kind", "is not a string");
  std::unique_ptr<Tokenizer> tok;
  if (kind == "char") {
    const nlohmann::json& chars = field("chars");
    if (!chars.is_string()) throw bad("chars", "is not a string");
    const std::string& s = chars.get_ref<const std::string&>();
    std::vector<char32_t> cps;
    for (size_t i = 0; i < s.size();) {
      char32_t c;
      const int len = utf8_decode(s, i, c);
      if (len == 0) throw bad("chars", "is not valid UTF-8");
      if (!cps.empty() && c <= cps.back()) throw bad("chars", "is not sorted by code point without repeats");
      cps.push_back(c);
      i += static_cast<size_t>(len);
    }
    if (cps.empty()) throw bad("chars", "is empty");
    tok = std::make_unique<CharTokenizer>(std::move(cps));
  } else if (kind == "gpt2") {
    const nlohmann::json& tokens = field("tokens");
    const nlohmann::json& merges = field("merges");
    if (!tokens.is_array()) throw bad("tokens", "is not an array");
    if (!merges.is_array()) throw bad("merges", "is not an array");
    std::vector<std::string> t, m;
    t.reserve(tokens.size());
    m.reserve(merges.size());
    for (const auto& x : tokens) {
      if (!x.is_string()) throw bad("tokens", "has an element that is not a string");
      t.push_back(x.get<std::string>());
    }
    for (const auto& x : merges) {
      if (!x.is_string()) throw bad("merges", "has an element that is not a string");
      m.push_back(x.get<std::string>());
    }
    std::string subject = source;
    subject += " (tokenizer)";
    tok = std::make_unique<Gpt2Tokenizer>(std::move(t), m, subject);
  } else {
    std::string what = "is '";
    what += kind.get<std::string>();
    what += "'; loom knows 'char' and 'gpt2'";
    throw bad("kind", what);
  }
  if (auto it = j.find("vocab_size"); it != j.end()) {
    if (!it->is_number_integer() || it->get<int64_t>() != tok->vocab_size()) {
      std::string what = "does not match the vocabulary it describes (";
      what += std::to_string(tok->vocab_size());
      what += " tokens)";
      throw bad("vocab_size", what);
    }
  }
  return tok;
}

// ---- CharTokenizer --------------------------------------------------------------------------

CharTokenizer::CharTokenizer(std::vector<char32_t> chars) : chars_(std::move(chars)) {
  std::fill(std::begin(ascii_), std::end(ascii_), -1);
  for (size_t i = 0; i < chars_.size(); ++i) {
    LOOM_ASSERT(i == 0 || chars_[i - 1] < chars_[i], "CharTokenizer: characters must be sorted and unique");
    const char32_t c = chars_[i];
    if (c < 128)
      ascii_[c] = static_cast<int32_t>(i);
    else
      stoi_.emplace(c, static_cast<int32_t>(i));
  }
}

CharTokenizer CharTokenizer::fit(std::string_view text, const std::string& subject) {
  if (text.empty())
    throw UserError(subject, "is empty: there are no characters to build a vocabulary from",
                    "give a non-empty text file");
  // A presence bit per code point: iterating it yields the characters already sorted, as
  // sorted(set(text)) does in prepare.py.
  std::vector<bool> seen(0x110000, false);
  for (size_t i = 0; i < text.size();) {
    char32_t c;
    const int len = utf8_decode(text, i, c);
    if (len == 0) invalid_utf8(text, i, subject);
    seen[c] = true;
    i += static_cast<size_t>(len);
  }
  std::vector<char32_t> chars;
  for (char32_t c = 0; c < 0x110000; ++c)
    if (seen[c]) chars.push_back(c);
  return CharTokenizer(std::move(chars));
}

std::vector<int32_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    char32_t c;
    const int len = utf8_decode(text, i, c);
    if (len == 0) invalid_utf8(text, i, "char tokenizer input");
    int32_t id = -1;
    if (c < 128) {
      id = ascii_[c];
    } else if (auto it = stoi_.find(c); it != stoi_.end()) {
      id = it->second;
    }
    if (id < 0) {
      std::string msg = "character ";
      msg += describe_char(c);
      msg += " at character ";
      msg += std::to_string(ids.size());
      msg += " is not in the vocabulary of ";
      msg += std::to_string(chars_.size());
      msg += " characters";
      throw UserError("char tokenizer", msg,
                      "a char vocabulary has only the characters of the text it was prepared from; "
                      "use those, or prepare the data again from a text that has this character");
    }
    ids.push_back(id);
    i += static_cast<size_t>(len);
  }
  return ids;
}

std::string CharTokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  out.reserve(ids.size());
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      std::string msg = "token id ";
      msg += std::to_string(id);
      msg += " is outside the vocabulary [0, ";
      msg += std::to_string(vocab_size());
      msg += ")";
      throw UserError("char tokenizer", msg, "decode ids made with this tokenizer's data");
    }
    utf8_append(out, chars_[static_cast<size_t>(id)]);
  }
  return out;
}

nlohmann::json CharTokenizer::to_json() const {
  std::string chars;
  for (const char32_t c : chars_) utf8_append(chars, c);
  return {{"kind", "char"}, {"vocab_size", vocab_size()}, {"chars", chars}};
}

// ---- Gpt2Tokenizer --------------------------------------------------------------------------

char32_t gpt2_byte_to_unicode(uint8_t b) {
  // bytes_to_unicode(): printable bytes keep their code point; the rest take 256, 257, ... in
  // byte order.
  auto printable = [](int x) { return (x >= '!' && x <= '~') || (x >= 0xA1 && x <= 0xAC) || (x >= 0xAE && x <= 0xFF); };
  if (printable(b)) return b;
  char32_t n = 0;
  for (int x = 0; x < b; ++x)
    if (!printable(x)) ++n;
  return 256 + n;
}

namespace {

constexpr std::string_view kEndOfText = "<|endoftext|>";

std::string in_quotes(std::string_view s) {
  std::string q = "'";
  q += s;
  q += "'";
  return q;
}

}  // namespace

Gpt2Tokenizer::Gpt2Tokenizer(std::vector<std::string> tokens, const std::vector<std::string>& merges,
                             const std::string& subject)
    : tokens_(std::move(tokens)), merges_(merges) {
  const std::string fix = "use GPT-2's encoder.json and vocab.bpe (openai/gpt-2, models/124M), unmodified";
  if (tokens_.empty()) throw UserError(subject, "has an empty vocabulary", fix);
  if (tokens_.size() > static_cast<size_t>(INT32_MAX)) throw UserError(subject, "has more than 2^31 - 1 tokens", fix);
  std::unordered_map<std::string_view, int32_t> index;
  index.reserve(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    if (!index.emplace(tokens_[id], static_cast<int32_t>(id)).second) {
      std::string msg = "token ";
      msg += in_quotes(tokens_[id]);
      msg += " appears twice (ids ";
      msg += std::to_string(index[tokens_[id]]);
      msg += " and ";
      msg += std::to_string(id);
      msg += ")";
      throw UserError(subject, msg, fix);
    }
  }

  // Byte symbols: every byte must have its one-symbol token, and every token's symbols must be
  // byte symbols, so that encode never fails and decode knows each token's bytes.
  std::unordered_map<char32_t, uint8_t> byte_of;
  for (int b = 0; b < 256; ++b) {
    const char32_t u = gpt2_byte_to_unicode(static_cast<uint8_t>(b));
    byte_of.emplace(u, static_cast<uint8_t>(b));
    std::string sym;
    utf8_append(sym, u);
    auto it = index.find(sym);
    if (it == index.end()) {
      std::string msg = "has no token for byte 0x";
      msg += hex(static_cast<uint32_t>(b), 2);
      msg += " (symbol ";
      msg += in_quotes(sym);
      msg += "); a byte-level BPE vocabulary needs all 256 byte symbols";
      throw UserError(subject, msg, fix);
    }
    byte_id_[b] = it->second;
  }
  decoded_.resize(tokens_.size());
  for (size_t id = 0; id < tokens_.size(); ++id) {
    const std::string& t = tokens_[id];
    std::string& bytes = decoded_[id];
    bool ok = !t.empty();
    for (size_t i = 0; ok && i < t.size();) {
      char32_t c;
      const int len = utf8_decode(t, i, c);
      auto it = len > 0 ? byte_of.find(c) : byte_of.end();
      if (it == byte_of.end()) {
        ok = false;
      } else {
        bytes += static_cast<char>(it->second);
        i += static_cast<size_t>(len);
      }
    }
    if (!ok) {
      std::string msg = "token ";
      msg += std::to_string(id);
      msg += " (";
      msg += in_quotes(t);
      msg += ") is not a string of GPT-2 byte symbols";
      throw UserError(subject, msg, fix);
    }
  }
  if (auto it = index.find(kEndOfText); it != index.end()) eot_id_ = it->second;

  merge_.reserve(merges_.size());
  for (size_t rank = 0; rank < merges_.size(); ++rank) {
    const std::string& line = merges_[rank];
    auto where = [&]() {
      std::string w = "merge ";
      w += in_quotes(line);
      w += " (rank ";
      w += std::to_string(rank);
      w += ")";
      return w;
    };
    const size_t sp = line.find(' ');
    if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos) {
      std::string msg = where();
      msg += " is not two symbols separated by one space";
      throw UserError(subject, msg, fix);
    }
    const std::string_view a = std::string_view(line).substr(0, sp), b = std::string_view(line).substr(sp + 1);
    const std::string ab = std::string(a) + std::string(b);
    auto ia = index.find(a), ib = index.find(b), iab = index.find(ab);
    for (auto [it, s] : {std::pair{ia, a}, std::pair{ib, b}, std::pair{iab, std::string_view(ab)}}) {
      if (it == index.end()) {
        std::string msg = where();
        msg += ": ";
        msg += in_quotes(s);
        msg += " is not a token of the vocabulary";
        throw UserError(subject, msg, fix);
      }
    }
    const uint64_t key = static_cast<uint64_t>(ia->second) << 32 | static_cast<uint32_t>(ib->second);
    // A repeated pair takes its last rank, as dict(zip(merges, range(len(merges)))) does.
    merge_[key] = static_cast<uint64_t>(rank) << 32 | static_cast<uint32_t>(iab->second);
  }
}

std::unique_ptr<Gpt2Tokenizer> Gpt2Tokenizer::load(const std::string& encoder_json, const std::string& vocab_bpe) {
  const std::string fix = "use GPT-2's encoder.json and vocab.bpe (openai/gpt-2, models/124M), unmodified";
  nlohmann::json enc;
  {
    const std::string text = read_text_file(encoder_json);
    try {
      enc = nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& e) {
      std::string msg = "is not valid JSON (";
      msg += e.what();
      msg += ")";
      throw UserError(encoder_json, msg, fix);
    }
  }
  if (!enc.is_object() || enc.empty())
    throw UserError(encoder_json, "is not a JSON object mapping token strings to ids", fix);
  const size_t n = enc.size();
  std::vector<std::string> tokens(n);
  std::vector<bool> have(n, false);
  for (const auto& [tok, id] : enc.items()) {
    if (!id.is_number_integer()) {
      std::string msg = "the id of token ";
      msg += in_quotes(tok);
      msg += " is not an integer";
      throw UserError(encoder_json, msg, fix);
    }
    const int64_t v = id.get<int64_t>();
    if (v < 0 || static_cast<uint64_t>(v) >= n || have[static_cast<size_t>(v)]) {
      std::string msg = "token ";
      msg += in_quotes(tok);
      msg += " has id ";
      msg += std::to_string(v);
      msg += "; the ids of its ";
      msg += std::to_string(n);
      msg += " tokens must be 0..";
      msg += std::to_string(n - 1);
      msg += ", each once";
      throw UserError(encoder_json, msg, fix);
    }
    have[static_cast<size_t>(v)] = true;
    tokens[static_cast<size_t>(v)] = tok;
  }

  std::vector<std::string> merges;
  {
    const std::string text = read_text_file(vocab_bpe);
    std::istringstream in(text);
    std::string line;
    for (int64_t line_no = 1; std::getline(in, line); ++line_no) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      if (line_no == 1 && line.starts_with("#")) continue;  // "#version: 0.2"
      if (line.empty()) continue;
      const size_t sp = line.find(' ');
      if (sp == std::string::npos || sp == 0 || sp + 1 == line.size() || line.find(' ', sp + 1) != std::string::npos) {
        std::string msg = "line ";
        msg += std::to_string(line_no);
        msg += " (";
        msg += in_quotes(line);
        msg += ") is not a merge: two symbols separated by one space";
        throw UserError(vocab_bpe, msg, fix);
      }
      merges.push_back(std::move(line));
    }
  }
  std::string subject = encoder_json;
  subject += " + ";
  subject += vocab_bpe;
  return std::make_unique<Gpt2Tokenizer>(std::move(tokens), merges, subject);
}

std::unique_ptr<Gpt2Tokenizer> Gpt2Tokenizer::load_dir(const std::string& dir) {
  std::string enc = dir, bpe = dir;
  if (!dir.empty() && dir.back() != '/') {
    enc += '/';
    bpe += '/';
  }
  enc += "encoder.json";
  bpe += "vocab.bpe";
  return load(enc, bpe);
}

void Gpt2Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  std::vector<int32_t> w;
  w.reserve(piece.size());
  for (const char ch : piece) w.push_back(byte_id_[static_cast<unsigned char>(ch)]);
  while (w.size() > 1) {
    // The adjacent pair of lowest rank; entries are (rank << 32 | merged id), so the smallest
    // entry is the lowest rank.
    uint64_t best = UINT64_MAX;
    size_t best_i = 0;
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      auto it = merge_.find(static_cast<uint64_t>(w[i]) << 32 | static_cast<uint32_t>(w[i + 1]));
      if (it != merge_.end() && it->second < best) best = it->second, best_i = i;
    }
    if (best == UINT64_MAX) break;
    const auto merged = static_cast<int32_t>(best & 0xFFFFFFFFu);
    const int32_t a = w[best_i], b = w[best_i + 1];
    // Merge every occurrence, left to right, without overlap (encoder.py's inner loop).
    size_t o = 0;
    for (size_t i = 0; i < w.size();) {
      if (i + 1 < w.size() && w[i] == a && w[i + 1] == b) {
        w[o++] = merged;
        i += 2;
      } else {
        w[o++] = w[i++];
      }
    }
    w.resize(o);
  }
  out.insert(out.end(), w.begin(), w.end());
}

std::vector<int32_t> Gpt2Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3);
  // Words repeat a lot in real text; encoder.py caches them the same way.
  std::unordered_map<std::string_view, std::vector<int32_t>> cache;
  auto encode_ordinary = [&](std::string_view segment) {
    for (const std::string_view piece : gpt2_pretokenize(segment)) {
      auto it = cache.find(piece);
      if (it == cache.end()) {
        std::vector<int32_t> p;
        bpe(piece, p);
        it = cache.emplace(piece, std::move(p)).first;
      }
      ids.insert(ids.end(), it->second.begin(), it->second.end());
    }
  };
  size_t start = 0;
  while (start < text.size()) {
    const size_t at = eot_id_ >= 0 ? text.find(kEndOfText, start) : std::string_view::npos;
    if (at == std::string_view::npos) {
      encode_ordinary(text.substr(start));
      break;
    }
    encode_ordinary(text.substr(start, at - start));
    ids.push_back(eot_id_);
    start = at + kEndOfText.size();
  }
  return ids;
}

std::string Gpt2Tokenizer::decode(std::span<const int32_t> ids) const {
  std::string out;
  for (const int32_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      std::string msg = "token id ";
      msg += std::to_string(id);
      msg += " is outside the vocabulary [0, ";
      msg += std::to_string(vocab_size());
      msg += ")";
      throw UserError("gpt2 tokenizer", msg, "decode ids made with this tokenizer's data");
    }
    out += decoded_[static_cast<size_t>(id)];
  }
  return out;
}

nlohmann::json Gpt2Tokenizer::to_json() const {
  return {{"kind", "gpt2"}, {"vocab_size", vocab_size()}, {"tokens", tokens_}, {"merges", merges_}};
}

// ---- GPT-2 pre-tokenization -----------------------------------------------------------------

std::vector<std::string_view> gpt2_pretokenize(std::string_view text) {
  // Characters of `text`: code point, class and byte offset (offs has one extra entry, the end).
  std::vector<char32_t> cps;
  std::vector<CpClass> cls;
  std::vector<size_t> offs;
  cps.reserve(text.size());
  cls.reserve(text.size());
  offs.reserve(text.size() + 1);
  for (size_t i = 0; i < text.size();) {
    char32_t c;
    int len = utf8_decode(text, i, c);
    if (len == 0) {
      c = 0xFFFFFFFF;  // an invalid byte: one "other" character
      len = 1;
    }
    cps.push_back(c);
    cls.push_back(c == 0xFFFFFFFF ? kOther : classify(c));
    offs.push_back(i);
    i += static_cast<size_t>(len);
  }
  offs.push_back(text.size());

  const size_t n = cps.size();
  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < n;) {
    size_t end = 0;
    // 's|'t|'re|'ve|'m|'ll|'d  (case-sensitive, as in GPT-2's pattern)
    if (cps[i] == '\'' && i + 1 < n) {
      const char32_t c1 = cps[i + 1];
      if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') {
        end = i + 2;
      } else if (i + 2 < n) {
        const char32_t c2 = cps[i + 2];
        if ((c1 == 'r' && c2 == 'e') || (c1 == 'v' && c2 == 'e') || (c1 == 'l' && c2 == 'l')) end = i + 3;
      }
    }
    if (end == 0) {
      // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: an optional ' ' and a run of one class.
      size_t j = i;
      if (cps[i] == ' ' && i + 1 < n && cls[i + 1] != kSpace) j = i + 1;
      if (cls[j] != kSpace) {
        end = j + 1;
        while (end < n && cls[end] == cls[j]) ++end;
      } else {
        // `\s+(?!\S)|\s+`: a whitespace run, less its last character when a non-space follows
        // (that character then starts the next piece, e.g. " word"), unless it is the only one.
        size_t e = i;
        while (e < n && cls[e] == kSpace) ++e;
        end = (e == n || e - i == 1) ? e : e - 1;
      }
    }
    pieces.push_back(text.substr(offs[i], offs[end] - offs[i]));
    i = end;
  }
  return pieces;
}

}  // namespace loom
