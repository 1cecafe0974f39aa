# One image per component, each tagged with the suite release (lj_runtimekit_version).
# `make docker` (or `docker buildx bake`) builds the default group.
variable "REGISTRY" {
  default = "lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit"
}

variable "lj_runtimekit_version" {
  default = "v1.13.0"
}

group "default" {
  targets = ["device-plugin", "scheduler", "exporter", "controller", "job-agent"]
}

target "_common" {
  context   = "."
  platforms = ["linux/amd64"]
  labels = {
    "org.opencontainers.image.source"  = "https://github.com/aliyun/LJ-RuntimeKit"
    "org.opencontainers.image.version" = lj_runtimekit_version
  }
}

target "device-plugin" {
  inherits   = ["_common"]
  dockerfile = "components/device-plugin/Dockerfile"
  tags       = ["${REGISTRY}/lj-runtimekit-device-plugin:${lj_runtimekit_version}"]
}

target "scheduler" {
  inherits   = ["_common"]
  dockerfile = "components/scheduler/Dockerfile"
  tags       = ["${REGISTRY}/lj-runtimekit-scheduler:${lj_runtimekit_version}"]
}

target "exporter" {
  inherits   = ["_common"]
  dockerfile = "components/exporter/Dockerfile"
  tags       = ["${REGISTRY}/lj-runtimekit-exporter:${lj_runtimekit_version}"]
}

target "controller" {
  inherits   = ["_common"]
  dockerfile = "components/controller/Dockerfile"
  tags       = ["${REGISTRY}/lj-runtimekit-controller:${lj_runtimekit_version}"]
}

target "job-agent" {
  inherits   = ["_common"]
  dockerfile = "components/job-agent/Dockerfile"
  tags       = ["${REGISTRY}/lj-runtimekit-controller-job-agent:${lj_runtimekit_version}"]
}
