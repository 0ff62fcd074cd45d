// The node types name resolution (name_resolution.cc) asks about, looked up by grammar symbol.
#pragma once

#include <tree_sitter/api.h>

#include <cstdint>
#include <iterator>
#include <string_view>
#include <vector>

#include "parser/py_module.h"

namespace patchgen::rewriter::name_types {

/// The node types the resolver asks about. tree-sitter hands out a node's type as its name; one
/// table lookup by grammar symbol (TypeOfNode) replaces the string comparisons of parser::Is, which
/// the walks below made for every node, many times over.
enum class Type : uint8_t {
  kOther,
  kAliasedImport,
  kAsPatternTarget,
  kAssignment,
  kAttribute,
  kAugmentedAssignment,
  kClassDefinition,
  kDefaultParameter,
  kDictionaryComprehension,
  kDictionarySplatPattern,
  kDottedName,
  kExceptClause,
  kForInClause,
  kForStatement,
  kFunctionDefinition,
  kFutureImportStatement,
  kGeneratorExpression,
  kGlobalStatement,
  kIdentifier,
  kImportFromStatement,
  kImportStatement,
  kKeywordArgument,
  kLambda,
  kLambdaParameters,
  kListComprehension,
  kListPattern,
  kListSplatPattern,
  kNamedExpression,
  kNonlocalStatement,
  kParameters,
  kPatternList,
  kRelativeImport,
  kSetComprehension,
  kTuplePattern,
  kTypedDefaultParameter,
  kTypedParameter,
  kWildcardImport
};

inline constexpr const char* kTypeNames[] = {
    nullptr,
    "aliased_import",
    "as_pattern_target",
    "assignment",
    "attribute",
    "augmented_assignment",
    "class_definition",
    "default_parameter",
    "dictionary_comprehension",
    "dictionary_splat_pattern",
    "dotted_name",
    "except_clause",
    "for_in_clause",
    "for_statement",
    "function_definition",
    "future_import_statement",
    "generator_expression",
    "global_statement",
    "identifier",
    "import_from_statement",
    "import_statement",
    "keyword_argument",
    "lambda",
    "lambda_parameters",
    "list_comprehension",
    "list_pattern",
    "list_splat_pattern",
    "named_expression",
    "nonlocal_statement",
    "parameters",
    "pattern_list",
    "relative_import",
    "set_comprehension",
    "tuple_pattern",
    "typed_default_parameter",
    "typed_parameter",
    "wildcard_import",
};
static_assert(std::size(kTypeNames) == static_cast<size_t>(Type::kWildcardImport) + 1,
              "one name per Type, in the enum's order");

inline Type TypeOfNode(TSNode n) {
  static const std::vector<Type> kTable = [] {
    const TSLanguage* language = parser::PythonLanguage();
    std::vector<Type> table(ts_language_symbol_count(language), Type::kOther);
    for (TSSymbol s = 0; s < table.size(); ++s) {
      const char* name = ts_language_symbol_name(language, s);
      for (size_t t = 1; name && t < std::size(kTypeNames); ++t) {
        if (std::string_view(name) == kTypeNames[t]) table[s] = static_cast<Type>(t);
      }
    }
    return table;
  }();
  TSSymbol s = ts_node_symbol(n);
  return s < kTable.size() ? kTable[s] : Type::kOther;
}

inline bool Is(TSNode n, Type type) { return TypeOfNode(n) == type; }

}  // namespace patchgen::rewriter::name_types
