# One image per component. Each is tagged with its component's own version (`make docker` passes
# them from the components' pyproject.toml), or with lj_runtimekit_version for all when that is
# set (guide §3.3). `make docker` (or `docker buildx bake`) builds the default group.
variable "REGISTRY" {
  default = "lj-runtimekit-registry.cn-hangzhou.cr.aliyuncs.com/lj-runtimekit"
}

variable "lj_runtimekit_version" {
  default = "v1.14.0"
}

variable "DEVICE_PLUGIN_VERSION" {
  default = lj_runtimekit_version
}

variable "SCHEDULER_VERSION" {
  default = lj_runtimekit_version
}

variable "EXPORTER_VERSION" {
  default = lj_runtimekit_version
}

variable "CONTROLLER_VERSION" {
  default = lj_runtimekit_version
}

variable "JOB_AGENT_VERSION" {
  default = lj_runtimekit_version
}

variable "OPERATOR_VERSION" {
  default = lj_runtimekit_version
}

group "default" {
  targets = ["device-plugin", "scheduler", "exporter", "controller", "job-agent", "operator"]
}

target "_common" {
  context   = "."
  platforms = ["linux/amd64"]
  labels = {
    "org.opencontainers.image.source"  = "https://github.com/aliyun/LJ-RuntimeKit"
  }
}

target "device-plugin" {
  inherits   = ["_common"]
  dockerfile = "components/device-plugin/Dockerfile"
  tags       = ["${REGISTRY}/lj-runtimekit-device-plugin:${DEVICE_PLUGIN_VERSION}"]
  labels     = { "org.opencontainers.image.version" = DEVICE_PLUGIN_VERSION }
}

target "scheduler" {
  inherits   = ["_common"]
  dockerfile = "components/scheduler/Dockerfile"
  tags       = ["${REGISTRY}/lj-runtimekit-scheduler:${SCHEDULER_VERSION}"]
  labels     = { "org.opencontainers.image.version" = SCHEDULER_VERSION }
}

target "exporter" {
  inherits   = ["_common"]
  dockerfile = "components/exporter/Dockerfile"
  tags       = ["${REGISTRY}/lj-runtimekit-exporter:${EXPORTER_VERSION}"]
  labels     = { "org.opencontainers.image.version" = EXPORTER_VERSION }
}

target "controller" {
  inherits   = ["_common"]
  dockerfile = "components/controller/Dockerfile"
  tags       = ["${REGISTRY}/lj-runtimekit-controller:${CONTROLLER_VERSION}"]
  labels     = { "org.opencontainers.image.version" = CONTROLLER_VERSION }
}

target "job-agent" {
  inherits   = ["_common"]
  dockerfile = "components/job-agent/Dockerfile"
  tags       = ["${REGISTRY}/lj-runtimekit-controller-job-agent:${JOB_AGENT_VERSION}"]
  labels     = { "org.opencontainers.image.version" = JOB_AGENT_VERSION }
}

target "operator" {
  inherits   = ["_common"]
  dockerfile = "components/operator/Dockerfile"
  tags       = ["${REGISTRY}/lj-runtimekit-operator:${OPERATOR_VERSION}"]
  labels     = { "org.opencontainers.image.version" = OPERATOR_VERSION }
}
