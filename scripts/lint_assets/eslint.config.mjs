// ESLint's flat config for the replay page's script, a classic browser script (not a
// module) inlined into the page: ESLint's recommended rules, and a few more that keep
// it plain: nothing leaks into the page's globals, no value or expression goes unused,
// no name hides another, equality is strict, and what is never reassigned is const.
import js from "@eslint/js";

export default [
  js.configs.recommended,
  {
    files: ["**/*.js"],
    languageOptions: {
      sourceType: "script",
      globals: { document: "readonly", window: "readonly", requestAnimationFrame: "readonly" },
    },
    linterOptions: { reportUnusedDisableDirectives: "error" },
    rules: {
      "no-implicit-globals": "error",
      "no-unused-vars": ["error", { args: "all" }],
      "no-unused-expressions": "error",
      "no-shadow": "error",
      "no-use-before-define": ["error", { functions: false }],
      eqeqeq: "error",
      "prefer-const": "error",
      "no-var": "error",
    },
  },
];
