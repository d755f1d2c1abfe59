// Stylelint's config for the replay page's style: the recommended rules, which report
// likely mistakes (unknown properties, invalid colours, duplicate selectors), not taste.
export default {
  extends: ["stylelint-config-recommended"],
};
