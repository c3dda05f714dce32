// Imported rather than read next to this file: the build bundles it, and dist/ is not where src/ is.
// A module of its own so that the CLI's --version does not load the routes (and their database code).
import pkg from '../../package.json' with { type: 'json' }

/** The release this build is: `GET /api/version`, the OpenAPI `info.version` and `gatehouse --version`. */
export const RELEASE = pkg.version

/** The package's SPDX licence, as the OpenAPI `info.license` states it. */
export const LICENSE = pkg.license
